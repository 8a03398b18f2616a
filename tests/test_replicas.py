"""Replicas: two real `docqa serve` processes over one data folder behind a real HAProxy
(tools.replicas), asked through OpenAI's client: questions on a document stick to one worker,
documents spread over both, and each worker answers about what the other stored."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tools.replicas import POLICIES, REPLICA_HEADER, haproxy_config, parse_workers

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy (apt-get install haproxy)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _document(i: int) -> bytes:
    filler = ["The harbour master logs every ship.", "Gulls circle the pier at dawn.", "Fog rolls in from the sea."]
    lines = [filler[(i + k) % 3] for k in range(90)]
    lines.insert(45, f"The special magic number for quiet-lighthouse-{i} is {8316400 + 11 * i}.")
    return " ".join(lines).encode()


def _wait_ready(url: str, procs: list[subprocess.Popen], timeout_s: float = 180.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a worker exited before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Two `docqa serve` workers on one data folder; yields their urls."""
    folder = tmp_path_factory.mktemp("replicas")
    data = folder / "data"
    ports = [_free_port(), _free_port()]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", GRADIO_ANALYTICS_ENABLED="False")
    procs = []
    try:
        for port in ports:
            log = open(folder / f"worker-{port}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen([sys.executable, "-m", "ui.cli", "serve", "--data-dir", str(data), "--port",
                                           str(port), "--device", "cpu"], cwd=REPO, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            _wait_ready(f"{url}/v1/models", procs)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(params=["sticky", "bounded"])
def replicas(request, workers, tmp_path):
    """HAProxy in front of the workers, routing by `policy`; yields (balancer url, worker urls)."""
    port = _free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_config(parse_workers([u.removeprefix("http://") for u in workers]),
                                  bind=f"127.0.0.1:{port}", policy=request.param))
    balancer = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / "haproxy.log", "w"))  # noqa: SIM115 - closed with it
    try:
        _wait_ready(f"http://127.0.0.1:{port}/v1/models", [balancer])
        yield f"http://127.0.0.1:{port}", workers, request.param
    finally:
        balancer.terminate()
        balancer.wait(timeout=20)


def test_every_routing_policy_is_a_valid_haproxy_configuration(tmp_path):
    for policy in POLICIES:
        cfg = tmp_path / f"{policy}.cfg"
        cfg.write_text(haproxy_config(parse_workers(["127.0.0.1:7861", "127.0.0.1:7862"]), policy=policy))
        check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def _client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _ask(client, doc_id: str, question: str):
    raw = client.chat.completions.with_raw_response.create(
        model="docqa-tiny", max_tokens=16, extra_body={"documents": [doc_id]},
        messages=[{"role": "user", "content": question}])
    return raw.headers[REPLICA_HEADER], raw.parse()


def test_questions_stick_to_one_worker_per_document_over_one_data_folder(replicas):
    balancer, workers, policy = replicas
    client = _client(balancer)
    docs = {}
    for i in range(4):  # the same files for both policies: the second run finds them stored
        raw = client.files.with_raw_response.create(file=(f"lighthouse-{i}.txt", _document(i)), purpose="user_data")
        docs[i] = raw.parse().id
    questions = ["What is the special magic number for quiet-lighthouse-{i} mentioned in the provided text?",
                 "Which number belongs to quiet-lighthouse-{i}?", "quiet-lighthouse-{i}: what is its magic number?"]
    served: dict[int, list[str]] = {i: [] for i in docs}
    for q in questions:
        for i, doc_id in docs.items():
            replica, reply = _ask(client, doc_id, q.format(i=i))
            served[i].append(replica)
            assert reply.model_extra["citations"], "an answer cites its document"
    # Affinity: every later question on a document went where its first one did.
    later = [r for rs in served.values() for r in rs[1:]]
    hits = sum(r == rs[0] for rs in served.values() for r in rs[1:])
    print(f"{policy}: affinity hit rate {hits}/{len(later)}; documents per worker "
          f"{Counter(rs[0] for rs in served.values())}")
    assert hits == len(later)  # one question at a time: no worker is ever past the bounded policy's load limit
    if policy == "sticky":  # least connections spread the documents seen first over both workers
        assert {rs[0] for rs in served.values()} == {"w0", "w1"}
    # Each worker answers about a document whichever worker stored it (one data folder).
    for url in workers:
        for doc_id in docs.values():
            reply = _client(url).chat.completions.create(
                model="docqa-tiny", max_tokens=8, extra_body={"documents": [doc_id]},
                messages=[{"role": "user", "content": "What is the magic number?"}])
            assert reply.model_extra["citations"]


def test_two_workers_adding_documents_at_once_both_store_them(workers):
    ids: dict[str, str] = {}

    def upload(url: str, i: int) -> None:
        ids[url] = _client(url).files.create(file=(f"parallel-{i}.txt", _document(10 + i)), purpose="user_data").id

    threads = [threading.Thread(target=upload, args=(url, i)) for i, url in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 2
    for url in workers:
        listed = {f.id: f.status for f in _client(url).files.list().data}
        assert all(listed.get(doc_id) == "processed" for doc_id in ids.values())
