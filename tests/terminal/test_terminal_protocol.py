from runner.terminal.protocol import (
    PARSE_ERROR_OBSERVATION,
    ScriptedAgent,
    observation,
    parse_action,
)


def test_single_command():
    a = parse_action("<command>ls -la</command>")
    assert (a.kind, a.command) == ("command", "ls -la")


def test_think_is_ignored_and_may_contain_tags():
    a = parse_action(
        "<think>maybe <action>done</action> or <command>rm -rf /</command></think>"
        "<command>echo hi</command>"
    )
    assert (a.kind, a.command) == ("command", "echo hi")


def test_done_wins_over_commands():
    assert parse_action("<command>ls</command><action>done</action>").kind == "done"
    assert parse_action("<action> done </action>").kind == "done"


def test_last_of_several_commands_runs():
    a = parse_action("<command>one</command> text <command>two\nlines</command>")
    assert a.command == "two\nlines"


def test_anything_else_is_a_parse_error():
    for text in [
        "ls -la",
        "",
        "<command></command>",
        "<command>unclosed",
        "<think>never closed <command>ls</command>",
    ]:
        assert parse_action(text).kind == "parse_error", text
    assert PARSE_ERROR_OBSERVATION.startswith("Could not parse")


def test_observation_format_exact():
    assert observation("x", 0) == "Command executed successfully. Output: x\n\n(exit_code=0)"
    assert observation("", 2) == "Command failed. Output: \n\n(exit_code=2)"


def test_scripted_agent_replays_then_done(tmp_path):
    f = tmp_path / "sol.sh"
    f.write_text("# comment\necho a\n\n  \necho b\n")
    agent = ScriptedAgent.from_file(f)
    msgs = [{"role": "user", "content": "task"}]
    out = []
    for _ in range(3):
        reply = agent(msgs)
        out.append(reply)
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "obs"}]
    assert out == [
        "<command>echo a</command>",
        "<command>echo b</command>",
        "<action>done</action>",
    ]
