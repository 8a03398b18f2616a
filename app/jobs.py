"""An ingest's progress as a person reads it: pages and chunks done, and the time left.

The jobs table (storage) keeps each ingest's stage, counts and when its stage began; `progress_of`
turns one row into a `JobProgress`. Pure: the clock is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class JobProgress:
    id: int
    name: str
    stage: str  # "extracting", "encoding", "ready", ...: the first word of the job's stage
    fraction: float  # 0-1, the whole ingest (reading the pages is the first half, encoding the second)
    pages_done: int
    pages_total: int
    chunks_done: int
    chunks_total: int
    seconds_left: float | None  # None until it can be estimated (no chunk encoded yet)
    state: str  # "running" | "done" | "failed"
    error: str | None


def seconds_left(done: int, total: int, elapsed_s: float) -> float | None:
    """The time the remaining `total - done` units take at the rate so far; None before the first."""
    if done <= 0 or total <= 0 or elapsed_s < 0:
        return None
    return max(0.0, elapsed_s / done * (total - done))


def progress_of(row: dict, now: datetime) -> JobProgress:
    """One jobs-table row (storage.DocumentStore.jobs) as progress. Only encoding is estimated: it is
    most of an ingest's time, and how many chunks a document makes is known once its text is."""
    stage = (row.get("stage") or "queued").split()[0]
    left = None
    if stage == "encoding" and row.get("stage_started_at"):
        elapsed = (now - datetime.fromisoformat(row["stage_started_at"])).total_seconds()
        left = seconds_left(row.get("chunks_done", 0), row.get("chunks_total", 0), elapsed)
    return JobProgress(row["id"], row["name"], stage, float(row["fraction"]), row.get("pages_done", 0),
                       row.get("pages_total", 0), row.get("chunks_done", 0), row.get("chunks_total", 0), left,
                       row["state"], row.get("error"))


def describe(job: JobProgress) -> str:
    """One line: "reading page 12 of 60", "encoding chunk 3 of 40, about 20 s left"."""
    if job.state == "failed":
        return f"not added: {job.error}" if job.error else "not added"
    if job.state == "done" or job.stage == "ready":
        return f"added ({job.pages_total} pages, {job.chunks_total} chunks)"
    if job.stage == "extracting":
        return f"reading page {job.pages_done} of {job.pages_total}" if job.pages_total else "reading the file"
    if job.stage == "encoding":
        if not job.chunks_total:
            return f"{job.pages_total} pages read; cutting into chunks"
        left = "estimating the time left" if job.seconds_left is None else f"about {_duration(job.seconds_left)} left"
        return f"{job.pages_total} pages read; encoding chunk {job.chunks_done} of {job.chunks_total}, {left}"
    return "waiting to start"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
