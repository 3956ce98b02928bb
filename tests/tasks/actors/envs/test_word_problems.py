import random
import re
from collections import Counter

import pytest

from tasks.actors.envs import resolve_entrypoint
from tasks.actors.envs.word_problems import FORMAT, REGEXES, TEMPLATES, ExpressionError, WordProblems, evaluate

PROBLEM = "Mia has 37 marbles. She buys 48 more. How many marbles does she have now?"
TWO_STEP = ("A box holds 12 big pencils and 30 small pencils. Ben buys 14 boxes. "
            "How many pencils does he buy?")


def kind_of(prompt):
    return next(t.kind for t, regex in zip(TEMPLATES, REGEXES, strict=True) if regex.fullmatch(prompt))


def play(env, prompt, actions):
    """The last step's (obs, reward, done, info) after playing actions from reset."""
    env.reset(prompt)
    for action in actions:
        result = env.step(action)
        if result[2]:
            return result
    raise AssertionError(f"episode not over after {actions}")


def test_call_the_tool_then_answer_with_its_result():
    env = WordProblems()
    assert env.reset(PROBLEM) == PROBLEM + FORMAT
    assert FORMAT == "\nUse <calc>expression</calc> to compute, then reply <answer>number</answer>."
    assert env.step("I will add them. <calc>37 + 48</calc>") == ("<result> 85</result>", 0.0, False,
                                                                  {"success": False})
    assert env.step("So she has <answer>85</answer> marbles.") == ("", 1.0, True, {"success": True})


def test_a_wrong_answer_ends_the_episode():
    env = WordProblems()
    env.reset(PROBLEM)
    assert env.step("<answer>84</answer>") == ("", 0.0, True, {"success": False})
    env.reset(PROBLEM)
    assert env.step("<answer> 85 </answer>") == ("", 1.0, True, {"success": True})


@pytest.mark.parametrize("action, error", [
    ("85", "no <calc> or <answer> tag"),
    ("<calc>37+48", "unclosed <calc> tag: end it with </calc>"),
    ("<answer>85", "unclosed <answer> tag: end it with </answer>"),
    ("<calc>  </calc>", "empty <calc> tag"),
    ("<answer></answer>", "empty <answer> tag"),
    ("<calc>37+48</calc><answer>85</answer>", "both <calc> and <answer> tags: write one per turn"),
    ("<calc>3+</calc>", "bad expression '3+': expected a number at 2"),
    ("<calc>(3+4</calc>", "bad expression '(3+4': expected ')' at 4"),
    ("<calc>8/2</calc>", "bad expression '8/2': unexpected '/' at 1"),
    ("<calc>x</calc>", "bad expression 'x': expected a number at 0"),
    ("<calc>" + "1+" * 32 + "1</calc>", f"bad expression '{'1+' * 32}1': longer than 64 characters"),
    ("<calc>9999999*9999999</calc>", "bad expression '9999999*9999999': its value has more than 12 digits"),
    ("<answer>eighty-five</answer>", "bad answer 'eighty-five': expected an integer"),
])
def test_malformed_actions_are_named_errors_and_cost_a_turn(action, error):
    env = WordProblems(max_turns=2)
    env.reset(PROBLEM)
    assert env.step(action) == (f"<error>{error}</error>", 0.0, False, {"success": False})
    assert env.step(action) == (f"<error>{error}</error>", 0.0, True, {"success": False})


def test_the_first_tag_of_its_kind_counts():
    env = WordProblems()
    env.reset(PROBLEM)
    assert env.step("<calc>2*3</calc> or <calc>5</calc>")[0] == "<result> 6</result>"
    assert env.step("<answer>85</answer><answer>1</answer>")[1:] == (1.0, True, {"success": True})


def test_max_turns_ends_the_episode():
    env = WordProblems(max_turns=3)
    env.reset(PROBLEM)
    assert env.step("<calc>37+48</calc>")[2] is False
    assert env.step("hmm")[2] is False
    assert env.step("<calc>37+48</calc>") == ("<result> 85</result>", 0.0, True, {"success": False})
    env.reset(PROBLEM)  # reset starts the count again
    assert env.step("hmm")[2] is False


@pytest.mark.parametrize("text, value", [
    ("2+3*4", 14), ("(2+3)*4", 20), ("2*3+4*5", 26), ("10-4-3", 3), ("10-(4-3)", 9),
    ("-3*4", -12), ("2*-3", -6), ("--5", 5), (" ( 12 + 30 ) * 4 ", 168), ("007", 7), ("((((1))))", 1),
    ("99*99-(99+1)", 9701), ("12-30", -18),
])
def test_the_parser_follows_precedence_and_parentheses(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize("text, message", [
    ("", "expected a number at 0"), ("3+", "expected a number at 2"), ("3 4", "unexpected '4' at 2"),
    ("(1+2))", "unexpected ')' at 5"), ("((1)", "expected ')' at 4"), ("2**3", "expected a number at 2"),
    ("2^3", "unexpected '^' at 1"), ("1.5", "unexpected '.' at 1"), ("1e3", "unexpected 'e' at 1"),
    ("__import__('os')", "expected a number at 0"), ("٣+1", "expected a number at 0"),  # an Arabic-Indic 3
    ("(" * 65, "longer than 64 characters"),
])
def test_the_parser_rejects_bad_input(text, message):
    with pytest.raises(ExpressionError, match=f"^{re.escape(message)}$"):
        evaluate(text)


def test_tasks_are_deterministic_and_use_every_template():
    env = WordProblems(two_step=0.5)
    assert env.task(random.Random("0:3")) == env.task(random.Random("0:3"))
    rng = random.Random(0)
    prompts = [env.task(rng) for _ in range(500)]
    matched = Counter(next(i for i, regex in enumerate(REGEXES) if regex.fullmatch(p)) for p in prompts)
    assert set(matched) == set(range(len(TEMPLATES))) and len(TEMPLATES) >= 6
    assert set("".join(t.expr for t in TEMPLATES)) & set("+-*/") == {"+", "-", "*"}
    assert 0.4 < sum(TEMPLATES[i].kind == "two" for i in matched.elements()) / 500 < 0.6


def test_reset_rederives_every_answer_from_the_prompt():
    env, rng = WordProblems(two_step=0.5), random.Random(1)
    for _ in range(500):
        prompt = env.task(rng)
        matches = [i for i, regex in enumerate(REGEXES) if regex.fullmatch(prompt)]
        assert len(matches) == 1, prompt  # one template per prompt: the answer is unambiguous
        template, match = TEMPLATES[matches[0]], REGEXES[matches[0]].fullmatch(prompt)
        fields = {k: int(v) for k, v in match.groupdict().items() if k in ("a", "b", "c", "d")}
        assert all(10 <= n <= 99 for n in fields.values()), prompt
        a, b, c = fields["a"], fields["b"], fields.get("c")
        answer = {"{a}+{b}": a + b, "{a}-{b}": a - b, "{a}*{b}": a * b, "({a}+{b})*{c}": (a + b) * (c or 0),
                  "{a}*{b}-{c}": a * b - (c or 0), "{a}+{b}-{c}": a + b - (c or 0),
                  "{a}*{b}+{c}": a * b + (c or 0)}[template.expr]
        assert answer >= 0, prompt
        assert play(env, prompt, [f"<answer>{answer + 1}</answer>"])[3] == {"success": False}
        assert play(env, prompt, [f"<answer>{answer}</answer>"])[3] == {"success": True}, prompt


def test_the_expert_wins():
    env, rng = WordProblems(two_step=0.5, max_turns=2), random.Random(2)
    assert env.demonstration(PROBLEM) == ["<calc> 37 + 48</calc>", "<answer> 85</answer>"]
    assert env.demonstration(TWO_STEP) == ["<calc> ( 12 + 30 ) * 14</calc>", "<answer> 588</answer>"]
    for _ in range(500):
        prompt = env.task(rng)
        assert play(env, prompt, env.demonstration(prompt)) == ("", 1.0, True, {"success": True}), prompt


def test_a_careless_expert_swaps_the_operation_on_its_share_of_prompts_and_answers_its_own_call():
    careful, careless, rng = WordProblems(two_step=0.5), WordProblems(two_step=0.5, expert_error=0.6), random.Random(5)
    prompts = [careful.task(rng) for _ in range(1000)]
    wrong = 0
    for prompt in prompts:
        right_calc, _ = careful.demonstration(prompt)
        calc, answer = careless.demonstration(prompt)
        assert careless.demonstration(prompt) == [calc, answer]  # the same prompt, the same demonstration
        careless.reset(prompt)
        observation, _, done, _ = careless.step(calc)
        assert not done and answer == observation.replace("result", "answer")  # it answers its own call
        won = play(careless, prompt, [calc, answer])[3]["success"]
        if calc != right_calc:
            wrong += 1
            swapped = [(a, b) for a, b in zip(right_calc, calc, strict=True) if a != b]
            assert swapped in ([("+", "-")], [("-", "+")], [("*", "+")]), (right_calc, calc)
        assert won == (calc == right_calc), prompt  # with numbers of at least 10 no swap keeps the value
    assert 0.55 < wrong / len(prompts) < 0.65
    assert not careful.expert_may_lose and careless.expert_may_lose


def test_the_experts_numbers_are_the_problems_tokens():
    """Each number the expert writes (and the tool's result) is one the BPE tokenizer reads as the
    problem's own: " 37" after a space, as in the text, not "37"."""
    env = WordProblems(two_step=0.5)
    calc, answer = env.demonstration(TWO_STEP)
    assert re.findall(r"(.)(\d+)", calc) == [(" ", "12"), (" ", "30"), (" ", "14")]
    assert all(f" {number}" in TWO_STEP for number in ("12", "30", "14"))
    env.reset(TWO_STEP)
    assert env.step(calc)[0] == "<result> 588</result>" and answer == "<answer> 588</answer>"


def test_distractors_and_two_step_problems_can_be_turned_off():
    env, rng = WordProblems(two_step=0.0, distractors=False), random.Random(3)
    assert {kind_of(env.task(rng)) for _ in range(300)} == {"one"}
    only_two = WordProblems(two_step=1.0)
    assert {kind_of(only_two.task(rng)) for _ in range(100)} == {"two"}
    with pytest.raises(ValueError, match=r"two-step problems are off \(two_step=0\)"):
        env.reset(TWO_STEP)
    with pytest.raises(ValueError, match="distractors are off"):
        env.reset("Tom is 12 years old and has 45 stickers. He gives away 19. How many stickers are left?")
    assert WordProblems().reset("Tom is 12 years old and has 45 stickers. He gives away 19. "
                                "How many stickers are left?").startswith("Tom is 12")


@pytest.mark.parametrize("prompt, message", [
    ("3+4", "not a word problem: '3\\+4'"),
    (PROBLEM.replace("She", "He"), "not a word problem: "),  # the pronoun is not the name's
    (PROBLEM.replace("37", "037"), "not a word problem: "),
    (PROBLEM.replace("Mia", "Bob"), "not a word problem: "),
    (PROBLEM + " ", "not a word problem: "),
    ("Mia has 37 marbles and 12 marbles. She buys 48 more marbles. How many marbles does she have now?",
     "not a word problem: "),
    (PROBLEM.replace("37", "137"), "^not a word problem of this environment: its numbers must be in 10..99"),
    (PROBLEM.replace("37", "7"), r"its numbers must be in 10\.\.99"),
    ("Mia has 37 marbles. She gives away 48. How many marbles are left?", "its answer is negative"),
])
def test_reset_rejects_prompts_that_are_not_its_own(prompt, message):
    with pytest.raises(ValueError, match=message):
        WordProblems().reset(prompt)
    with pytest.raises(ValueError, match=message):
        WordProblems().demonstration(prompt)


def test_larger_numbers():
    env, rng = WordProblems(max_number=999, two_step=0.5), random.Random(4)
    prompts = [env.task(rng) for _ in range(200)]
    assert any(int(n) > 99 for p in prompts for n in re.findall(r"\d+", p))
    for prompt in prompts:
        assert play(env, prompt, env.demonstration(prompt))[1] == 1.0
    with pytest.raises(ValueError, match=r"numbers must be in 10\.\.99"):
        WordProblems().reset(PROBLEM.replace("37", "137"))


@pytest.mark.parametrize("kwargs, message", [
    ({"two_step": 1.5}, "two_step must be"), ({"two_step": -0.1}, "two_step must be"),
    ({"two_step": "0.5"}, "two_step must be"), ({"distractors": "no"}, "distractors must be"),
    ({"max_turns": 1}, "max_turns must be"), ({"max_turns": 2.0}, "max_turns must be"),
    ({"expert_error": 1.5}, "expert_error must be"), ({"expert_error": True}, "expert_error must be"),
    ({"max_number": 10}, "max_number must be"), ({"max_number": 1000}, "max_number must be"),
    ({"max_number": True}, "max_number must be"),
])
def test_bad_kwargs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WordProblems(**kwargs)


def test_builtin_name():
    assert resolve_entrypoint("word-problems") is WordProblems
