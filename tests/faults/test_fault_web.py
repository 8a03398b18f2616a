"""The web app under faults and attacks: a real `docqa serve` on 127.0.0.1, the real Gradio client,
raw HTTP, and real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from faultkit import CLI_ENV, DOC_A, NEEDLE_Q, REPO, run, text_doc

SLOW_DOC = text_doc("One of the special magic numbers for violet-moth is: 3141592.", repeats=120)  # ~40 chunks
ASK_SETTINGS = [4, 128, 0, 64, 0.9, "static", "threshold", 0.8]  # the Settings panel's inputs, in order


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory, bundled_service_factory):
    """`docqa serve` over a library of two documents, uploads capped at 1 MiB."""
    data = tmp_path_factory.mktemp("web") / "data"
    service = bundled_service_factory(data)
    ids = {"a.txt": service.ingest(DOC_A, "a.txt")[0].record.id,
           "slow.txt": service.ingest(SLOW_DOC, "slow.txt")[0].record.id}
    del service
    port = _free_port()
    log = open(data.parent / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "ui.cli", "serve", "--data-dir", str(data), "--device", "cpu",
                             "--port", str(port), "--max-upload-mb", "1"], cwd=REPO, stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, env=os.environ | CLI_ENV | {"GRADIO_HEARTBEAT_INTERVAL": "1"})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if _get(url)[0] == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the server did not start: " + (data.parent / "server.log").read_text()[-3000:])
    yield {"url": url, "port": port, "data": data, "ids": ids}
    proc.terminate()
    proc.wait(30)
    log.close()


@pytest.fixture
def client(server):
    from gradio_client import Client

    return Client(server["url"], verbose=False)


def _answer_text(final) -> str:
    content = final[0][-1]["content"]
    return content[0]["text"] if isinstance(content, list) else content


def test_listens_on_loopback_only(server):
    listening = []
    tables = [Path(f"/proc/net/{name}").read_text().splitlines()[1:] for name in ("tcp", "tcp6")]
    for line in tables[0] + tables[1]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == server["port"]:
            listening.append(local.rsplit(":", 1)[0])
    assert listening == ["0100007F"]  # 127.0.0.1, nothing else


def test_an_upload_over_the_limit_is_refused(server):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.txt\"\r\n"
            "Content-Type: text/plain\r\n\r\n").encode() + b"a" * (2 << 20) + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(server["url"] + "gradio_api/upload", data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        status = urllib.request.urlopen(req, timeout=60).status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status == 413


def test_no_file_outside_the_apps_uploads_is_served(server):
    data = server["data"]
    shared = Path("/tmp/gradio") / uuid.uuid4().hex  # another Gradio app's upload on this machine
    shared.mkdir(parents=True)
    (shared / "secret.txt").write_text("another app's upload")
    upload = next((data / "uploads").iterdir())
    try:
        for path in ["/etc/passwd", "../../../../etc/passwd", "%2e%2e/%2e%2e/etc/passwd", "..%2f..%2fetc%2fpasswd",
                     str(data / "docqa.sqlite"), str(upload), str(shared / "secret.txt"),
                     str(data / "tmp" / ".." / "docqa.sqlite"), "//etc/passwd", "file:///etc/passwd"]:
            status, body = _get(server["url"] + "gradio_api/file=" + path)
            assert status != 200 and b"root:" not in body and b"SQLite format" not in body, path
    finally:
        shutil.rmtree(shared)


def _raw_call(url: str, api_name: str, data: list) -> dict:
    """One event through Gradio's queue over plain HTTP, with the payload exactly as given (the
    Python client would upload a local path it is handed, which is not the attack)."""
    config = json.loads(_get(url + "config")[1])
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)
    session = uuid.uuid4().hex
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                       "trigger_id": None}).encode()
    req = urllib.request.Request(url + "gradio_api/queue/join", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
    with urllib.request.urlopen(url + f"gradio_api/queue/data?session_hash={session}", timeout=300) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed":
                    return msg
    raise AssertionError("no result")


def test_a_path_outside_the_uploads_cannot_be_ingested(server, client):
    shared = Path("/tmp/gradio") / uuid.uuid4().hex  # the machine-wide folder every Gradio app shares
    shared.mkdir(parents=True)
    (shared / "notes.txt").write_bytes(DOC_A.replace(b"amber-falcon", b"stolen-file"))
    try:
        for path in (shared / "notes.txt", server["data"] / "documents" / f"{server['ids']['a.txt']}.txt"):
            fake = {"path": str(path), "meta": {"_type": "gradio.FileData"}, "orig_name": "notes.txt"}
            msg = _raw_call(server["url"], "ingest", [[fake], ""])
            assert not msg.get("success") or "added (" not in json.dumps(msg["output"]), msg
        assert "notes.txt" not in {d["name"] for d in client.predict(api_name="/list_documents")}
    finally:
        shutil.rmtree(shared)


def test_documents_added_while_serving_can_be_asked_by_id(server, client, tmp_path):
    late = tmp_path / "late.txt"
    late.write_bytes(text_doc("One of the special magic numbers for late-lark is: 5550123."))
    res = run("ingest", str(late), "--data-dir", str(server["data"]), "--device", "cpu")
    assert res.returncode == 0, res.stderr
    doc_id = next(d["id"] for d in client.predict(api_name="/list_documents") if d["name"] == "late.txt")
    final = client.predict(NEEDLE_Q.replace("amber-falcon", "late-lark"), [], [doc_id], None, *ASK_SETTINGS,
                           api_name="/ask")
    assert "5550123" in _answer_text(final)


def test_upload_ask_delete_leaves_no_trace(server, client, tmp_path):
    from gradio_client import handle_file

    marker = b"The lamplighter of the west pier is called Orrin Vale."
    path = tmp_path / "traced.txt"
    path.write_bytes(text_doc("One of the special magic numbers for tide-gull is: 8080808.", marker.decode()))
    status = client.predict([handle_file(str(path))], "", api_name="/ingest")[0]
    assert "traced.txt**: added" in status, status
    doc_id = next(d["id"] for d in client.predict(api_name="/list_documents") if d["name"] == "traced.txt")
    final = client.predict(NEEDLE_Q.replace("amber-falcon", "tide-gull"), [], [doc_id], None, *ASK_SETTINGS,
                           api_name="/ask")
    assert "8080808" in _answer_text(final)
    kept = [p for p in (server["data"] / "tmp").rglob("*") if p.is_file() and marker in p.read_bytes()]
    assert kept == []  # the upload is not left in the temporary folder, where it could be served
    client.predict(doc_id, api_name="/delete_document")
    leftovers = [p for p in server["data"].rglob("*") if p.is_file() and marker in p.read_bytes()]
    assert leftovers == []


def test_a_huge_question_gets_a_clear_error_and_the_server_goes_on(server, client):
    # A note beside the chat (and a toast), not an error that would blank the conversation.
    chat, _, _, note = client.predict("x " * 10_000, [], [server["ids"]["a.txt"]], None, *ASK_SETTINGS,
                                      api_name="/ask")
    assert "too long" in note and "Traceback" not in note
    assert chat == {"__type__": "update"}  # the conversation left as it was
    final = client.predict(NEEDLE_Q, [], [server["ids"]["a.txt"]], None, *ASK_SETTINGS, api_name="/ask")
    assert "6150382" in _answer_text(final)


def _chromium():
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    return chromium, sync_playwright


BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_a_reload_shows_the_library_as_it_is_now(server, tmp_path):
    chromium, sync_playwright = _chromium()
    from playwright.sync_api import expect

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        page = browser.new_page()
        page.goto(server["url"])
        expect(page.locator("#documents")).to_contain_text("a.txt", timeout=60_000)
        fresh = tmp_path / "added-meanwhile.txt"
        fresh.write_bytes(text_doc("One of the special magic numbers for rain-wren is: 1212121."))
        assert run("ingest", str(fresh), "--data-dir", str(server["data"]), "--device", "cpu").returncode == 0
        page.reload()
        expect(page.locator("#documents")).to_contain_text("added-meanwhile.txt", timeout=60_000)
        expect(page.locator("#chat-documents")).to_contain_text("added-meanwhile.txt", timeout=60_000)
        browser.close()


def test_closing_the_tab_cancels_its_question(server, client):
    chromium, sync_playwright = _chromium()
    # Long enough that the answer's steps and lone reads outlast closing the tab many times over
    # (on a 2-core CPU: ~22 s of scoring, then ~7 s from the first step to the stored answer,
    # against 0.3 s to close), and no longer: the test waits through the scoring.
    question = "What is the special magic number for violet-moth, " + "and what else is said of it, " * 20 + "?"
    db = server["data"] / "docqa.sqlite"

    def conversations_titled(title):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute("SELECT c.id, COUNT(m.id) FROM conversations c LEFT JOIN messages m "
                                "ON m.conversation_id = c.id WHERE c.title = ? GROUP BY c.id", [title]).fetchall()
        finally:
            conn.close()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        page = browser.new_page()
        page.goto(server["url"])
        page.get_by_role("tab", name="Chat").click()
        page.locator("#question textarea").fill(question)
        page.locator("#ask").click()
        # The model is at work on it once the chat shows more than "selecting chunks..." (no
        # conversation is stored before its first answer, so the database cannot tell).
        page.get_by_text("selecting chunks...").wait_for(timeout=120_000)
        page.get_by_text("selecting chunks...").wait_for(state="detached", timeout=120_000)
        page.close()
        browser.close()
    # Closing the tab ends the question's answer stream, so nothing of it is stored (the
    # scheduler's side, a cancelled question dropped from its batch, is test_scheduler.py's); the
    # model goes on answering others.
    final = client.predict(NEEDLE_Q, [], [server["ids"]["a.txt"]], None, *ASK_SETTINGS, api_name="/ask")
    assert "6150382" in _answer_text(final)
    assert conversations_titled(question[:80]) == []
