"""The `docqa` and `docqa-tools` command lines, run as a user would (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys


def run_cli(*args, module="ui.cli"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=300)


def run_tools(*args):
    return run_cli(*args, module="tools.cli")


def test_generate_on_a_tiny_checkpoint(llada_dir):
    res = run_cli("generate", "--model", str(llada_dir), "--gen-length", "16", "--block-length",
                  "8", "--show-steps", "What is in the file?")
    assert res.returncode == 0, res.stderr
    assert "step    0 block 0" in res.stderr and "forward passes" in res.stderr


def test_make_random_model_then_generate(tmp_path):
    res = run_tools("make-random-model", str(tmp_path / "m"), "--family", "dream")
    assert res.returncode == 0 and "random" in res.stdout
    res = run_cli("generate", "--model", str(tmp_path / "m"), "--decoder", "maskgit_plus",
                  "--gen-length", "8", "--block-length", "8", "--steps", "4", "Hi")
    assert res.returncode == 0, res.stderr
    assert "4 steps" in res.stderr


def test_errors_are_one_clear_line(tmp_path, llada_dir):
    res = run_cli("generate", "--model", str(tmp_path / "missing"), "hi")
    assert res.returncode == 1
    assert res.stderr.strip() == (f"docqa: cannot load the model: model folder {tmp_path / 'missing'}"
                                  " does not exist or is not a folder")
    res = run_cli("generate", "--model", str(llada_dir), "--gen-length", "30", "hi")
    assert res.returncode == 2 and "multiple of block_length" in res.stderr
    assert "Traceback" not in res.stderr


def test_answer_over_a_text_file(llada_dir, tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("The river flows north. " * 40 + "The code word is sapphire. " + "Mountains rise. " * 40)
    res = run_cli("answer", "--model", str(llada_dir), "--chunk-size", "32", "--top-k", "auto",
                  "--token-budget", "8", "--gen-length", "8", "--block-length", "8",
                  "What is the code word?", str(doc))
    assert res.returncode == 0, res.stderr
    assert "notes.txt chunk" in res.stderr and "scoring" in res.stderr
    varied = tmp_path / "varied.txt"  # no two chunks alike: repeated text would tie on score
    varied.write_text(" ".join(f"Shelf {i} holds {i * 7 % 13} boxes of item {i * 31 % 97}." for i in range(60)))
    res = run_cli("answer", "--model", str(llada_dir), "--chunk-size", "32", "--top-k", "3", "--score-margin", "1e-9",
                  "--gen-length", "8", "--block-length", "8", "What is on shelf 12?", str(varied))
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("varied.txt chunk") == 1, "only the best of the 3 chunks is within the margin"
    res = run_cli("answer", "--model", str(llada_dir), "--chunk-size", "32", "--top-k", "3", "--coverage-gain", "1e6",
                  "--scorer", "self_information", "--gen-length", "8", "--block-length", "8", "What is on shelf 12?",
                  str(varied))
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("varied.txt chunk") == 1, "no other chunk adds a million nats a token"
    res = run_cli("answer", "--model", str(llada_dir), "--coverage-gain", "0.1", "--scorer", "attention", "q", str(doc))
    assert res.returncode == 2 and "coverage_gain needs a likelihood scorer" in res.stderr
    res = run_cli("answer", "--model", str(llada_dir), "--score-margin", "-1", "q", str(doc))
    assert res.returncode == 2 and res.stderr.strip() == "docqa: score_margin must be > 0 or None, got -1.0"
    res = run_cli("answer", "--model", str(llada_dir), "q", str(tmp_path / "missing.txt"))
    assert res.returncode == 2 and res.stderr.strip() == f"docqa: no such file: {tmp_path / 'missing.txt'}"


def test_bench_command_on_the_tiny_shape(tmp_path):
    res = run_tools("bench", "--shape", "tiny", "--contexts", "128", "--answers", "32", "--modes", "static",
                  "--chunk-size", "32", "--top-k", "2", "--device", "cpu", "--llada-folds", "0",
                  "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "bench.json").read_text())["meta"]
    assert meta["scorer"] == "draft_self_information" and meta["llada_folds"] == "leave-one-out"
    res = run_tools("bench", "--shape", "tiny", "--llada-folds", "-1", "--out", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip() == "docqa-tools: --llada-folds must be 0 (leave-one-out) or more, got -1"
