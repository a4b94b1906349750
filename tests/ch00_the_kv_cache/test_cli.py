"""Chapter 00: the command line explains itself, runs, and reports bad input without a traceback."""

import json
import subprocess
import sys

import pytest

from minipaged.cli import build_parser, main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "minipaged", *args], capture_output=True, text=True, timeout=300)


def test_every_subcommand_has_help_for_every_option():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    assert {"chat", "generate", "bench"} <= set(subparsers)
    for name, sub in subparsers.items():
        for action in sub._actions:
            if action.dest not in ("help", "bench") and action.option_strings:
                assert action.help, f"{name} {action.option_strings} has no help text"


def test_help_runs():
    r = run_cli("--help")
    assert r.returncode == 0 and "chat" in r.stdout and "generate" in r.stdout
    r = run_cli("generate", "--help")
    assert r.returncode == 0 and "--max-tokens" in r.stdout and "--file" in r.stdout


def test_generate_with_tiny_model_json(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond\\nwith a newline\n")
    assert main(["generate", "--model", "tiny", "--file", str(prompts), "--max-tokens", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["prompt"] for d in data] == ["first prompt", "second\nwith a newline"]
    assert all(len(d["outputs"][0]["token_ids"]) <= 4 for d in data)


def test_bad_input_is_an_error_message_not_a_traceback(capsys):
    assert main(["generate", "--model", "tiny", "--top-p", "2", "hello"]) == 2
    err = capsys.readouterr().err
    assert "SamplingParams.top_p=2.0" in err and "Traceback" not in err


@pytest.mark.slow
def test_chat_command_real_model():
    r = run_cli("chat", "What is the capital of France?", "--max-tokens", "20")
    assert r.returncode == 0 and "Paris" in r.stdout
    assert "Warning" not in r.stderr, r.stderr  # the demo prints no warning (progress bars only)


def test_importing_the_package_prints_nothing():
    """`import minipaged` and the model's modules print no warning, with every warning shown."""
    code = "import minipaged, minipaged.model.llama, minipaged.llm, minipaged.server.api"
    r = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr


def test_penalty_options_reach_sampling(capsys):
    from minipaged import LLM, SamplingParams

    argv = ["generate", "--model", "tiny", "--max-tokens", "6", "--ignore-eos", "--json", "hello there"]
    assert main(argv + ["--repetition-penalty", "1.5", "--presence-penalty", "1", "--frequency-penalty", "0.5"]) == 0
    got = json.loads(capsys.readouterr().out)[0]["outputs"][0]["token_ids"]
    want = LLM("tiny", progress=False).generate(["hello there"], SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, repetition_penalty=1.5, presence_penalty=1.0,
        frequency_penalty=0.5), use_tqdm=False)[0].outputs[0].token_ids
    assert got == want
    assert main(["generate", "--model", "tiny", "--presence-penalty", "3", "hello"]) == 2
    assert "SamplingParams.presence_penalty=3.0" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["generate", "hello"], ["chat", "hello"]])
@pytest.mark.parametrize("option", [["--repetition-penalty", "0"], ["--frequency-penalty", "nan"], ["--top-p", "2"]])
def test_a_bad_sampling_option_fails_before_the_model_loads(monkeypatch, capsys, command, option):
    """SmolLM2's weights take seconds to load: a bad option is reported before that, not after."""
    import minipaged

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(minipaged, "LLM", no_model)
    assert main([command[0], "--model", "tiny", *option, command[1]]) == 2
    err = capsys.readouterr().err
    assert f"SamplingParams.{option[0][2:].replace('-', '_')}=" in err and "Traceback" not in err
