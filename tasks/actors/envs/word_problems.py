"""Word problems: solve an arithmetic word problem with a calculator tool, in tagged text.

The prompt is a problem in plain English, such as "Mia has 37 marbles. She buys 48 more.
How many marbles does she have now?", from 13 templates over +, - and * (numbers
10..`max_number`, answers never negative): 6 of one operation, 3 that add a distractor,
a number the answer does not use ("Tom is 12 years old and has 45 stickers. ..."), and 4
of two operations, such as (a + b) * c, drawn for a share `two_step` of the tasks. Names
and objects vary. The first observation is the problem followed by the format (FORMAT).
The agent writes free text; each action is read for its tags:

    "<calc> 37 + 48</calc>"  the tool: integers, + - * and parentheses, at most 64
                             characters; the observation is "<result> 85</result>"
    "<answer> 85</answer>"   the final answer: the episode ends (observation "")
    anything else          "<error>what was wrong</error>", e.g. "no <calc> or <answer>
                           tag", "bad expression '3+': expected a number at 2"

Spaces inside the tags are free. The environment writes a number as a word, after a space
(the result, and the expert's calls and answers), because a byte-level BPE gives " 37" and
"37" different ids: written so, the number the problem states, the one the tool call needs
and the one the answer repeats are the same token, and following the expert is copying
tokens, not learning which of two ids means the same number.

Text around the tag is allowed; the first tag of its kind counts, and an action with both
kinds is an error. Every action costs a turn: after `max_turns` without an answer the
episode ends unsuccessful, so the environment always ends it itself. Rewards: 1 for the
right answer (success), 0 otherwise. Calling the tool earns nothing by itself: it is the
reliable way to the right answer (a small model that multiplies two-digit numbers in its
head is rarely right).

A uniformly random policy over a BPE vocabulary succeeds with probability effectively 0:
it must write the tags and the right number, about 7 tokens, by chance (of order V^-7 per
turn, below 1e-25 for any vocabulary of more than 10,000 tokens). Success has to come from
what the policy brings: the format is stated in the first observation so that an
instruction-tuned model can follow it from the start, and `demonstration` gives an
expert's actions for any prompt (a tool call, then the answer), for a supervised warm-up
before reinforcement learning.

`reset` re-derives the answer from the prompt alone (the templates' regular expressions),
and accepts only prompts this environment's kwargs could have produced.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

FORMAT = "\nUse <calc>expression</calc> to compute, then reply <answer>number</answer>."
MIN_NUMBER = 10  # numbers have at least two digits, so the answer needs the tool
MAX_EXPRESSION = 64  # characters inside <calc>
MAX_DIGITS = 12  # of a <calc> result
CARELESS = {"+": "-", "-": "+", "*": "+"}  # the careless expert's operation for the right one

NAMES = {"Mia": "she", "Tom": "he", "Ava": "she", "Leo": "he", "Zoe": "she",
         "Sam": "he", "Nina": "she", "Omar": "he", "Lily": "she", "Ben": "he"}
OBJECTS = ("marbles", "stickers", "apples", "pencils", "cards", "shells", "coins", "beads")


@dataclass(frozen=True)
class Template:
    kind: str  # "one" (one operation), "distractor" (one, and a number it does not use), "two"
    text: str  # fields: name, P/p (its pronoun, capitalised or not), obj, obj2, a, b, c, d
    expr: str  # the computation, over a, b, c (d is the distractor)


TEMPLATES = (
    Template("one", "{name} has {a} {obj}. {P} buys {b} more. How many {obj} does {p} have now?",
             "{a}+{b}"),
    Template("one", "{name} read {a} pages on Monday and {b} pages on Tuesday. "
                    "How many pages did {p} read in all?", "{a}+{b}"),
    Template("one", "{name} has {a} {obj}. {P} gives away {b}. How many {obj} are left?", "{a}-{b}"),
    Template("one", "A jar holds {a} {obj}. {name} takes out {b} of them. "
                    "How many {obj} are still in the jar?", "{a}-{b}"),
    Template("one", "{name} buys {a} boxes of {obj}. Each box holds {b} {obj}. "
                    "How many {obj} does {p} buy?", "{a}*{b}"),
    Template("one", "A hall has {a} rows of chairs with {b} chairs in each row. "
                    "How many chairs are in the hall?", "{a}*{b}"),
    Template("distractor", "{name} is {d} years old and has {a} {obj}. {P} gives away {b}. "
                           "How many {obj} are left?", "{a}-{b}"),
    Template("distractor", "{name} has {a} {obj} and {d} {obj2}. {P} buys {b} more {obj}. "
                           "How many {obj} does {p} have now?", "{a}+{b}"),
    Template("distractor", "{name} packs {a} boxes with {b} {obj} in each box. The boxes sit on "
                           "{d} shelves. How many {obj} does {p} pack?", "{a}*{b}"),
    Template("two", "A box holds {a} big {obj} and {b} small {obj}. {name} buys {c} boxes. "
                    "How many {obj} does {p} buy?", "({a}+{b})*{c}"),
    Template("two", "{name} buys {a} packs of {obj} with {b} in each pack, then gives away {c}. "
                    "How many {obj} are left?", "{a}*{b}-{c}"),
    Template("two", "{name} has {a} {obj}. {P} buys {b} more and then gives away {c}. "
                    "How many {obj} does {p} have now?", "{a}+{b}-{c}"),
    Template("two", "A hall has {a} rows of {b} chairs and {c} more chairs by the door. "
                    "How many chairs are in the hall?", "{a}*{b}+{c}"),
)

NUMBER_FIELDS = ("a", "b", "c", "d")
_FIELD_PATTERNS = {"name": "|".join(NAMES), "P": "He|She", "p": "he|she",
                   "obj": "|".join(OBJECTS), "obj2": "|".join(OBJECTS),
                   **{field: r"\d{1,6}" for field in NUMBER_FIELDS}}


def _regex(text: str) -> re.Pattern:
    """A template's text as a regular expression with a named group per field."""
    pattern, seen = "", set()
    for literal, field, _, _ in string.Formatter().parse(text):
        pattern += re.escape(literal)
        if field is not None:
            pattern += f"(?P={field})" if field in seen else f"(?P<{field}>{_FIELD_PATTERNS[field]})"
            seen.add(field)
    return re.compile(pattern)


REGEXES = tuple(_regex(template.text) for template in TEMPLATES)  # a prompt fully matches its own


def _spaced(expr: str) -> str:
    """An expression with a space before each number, operator and parenthesis: "(12+45)*33" ->
    " ( 12 + 45 ) * 33", every number written as it is in the problem's text."""
    return "".join(" " + part for part in re.findall(r"\d+|\S", expr))


def _render(template: Template, fields: dict) -> str:
    pronoun = NAMES.get(fields.get("name", ""), "")
    return template.text.format(P=pronoun.capitalize(), p=pronoun, **fields)


class ExpressionError(ValueError):
    """A <calc> expression that cannot be evaluated; the message says what and where."""


def evaluate(text: str) -> int:
    """The value of an integer expression over + - * (and unary -) with parentheses.

    A recursive-descent parser, not `eval`: anything else raises ExpressionError, with
    the 0-based position where the text went wrong.
    """
    if len(text) > MAX_EXPRESSION:
        raise ExpressionError(f"longer than {MAX_EXPRESSION} characters")
    parser = _Parser(text)
    value = parser.sum()
    parser.skip_spaces()
    if parser.i < len(text):
        raise ExpressionError(f"unexpected {text[parser.i]!r} at {parser.i}")
    return value


class _Parser:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def skip_spaces(self) -> str:
        """The next character that is not a space ("" at the end)."""
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1
        return self.text[self.i:self.i + 1]

    def sum(self) -> int:  # sum := product (("+" | "-") product)*
        value = self.product()
        while (op := self.skip_spaces()) in ("+", "-"):
            self.i += 1
            value = value + self.product() if op == "+" else value - self.product()
        return value

    def product(self) -> int:  # product := factor ("*" factor)*
        value = self.factor()
        while self.skip_spaces() == "*":
            self.i += 1
            value *= self.factor()
        return value

    def factor(self) -> int:  # factor := digits | "(" sum ")" | "-" factor
        c = self.skip_spaces()
        if c == "(":
            self.i += 1
            value = self.sum()
            if self.skip_spaces() != ")":
                raise ExpressionError(f"expected ')' at {self.i}")
            self.i += 1
            return value
        if c == "-":
            self.i += 1
            return -self.factor()
        start = self.i
        while self.i < len(self.text) and self.text[self.i] in string.digits:
            self.i += 1
        if self.i == start:
            raise ExpressionError(f"expected a number at {start}")
        return int(self.text[start:self.i])


class WordProblems:
    blocking = False  # pure computation: called on the actor's event loop, not in a thread

    def __init__(self, two_step: float = 0.25, distractors: bool = True, max_turns: int = 4,
                 max_number: int = 99, expert_error: float = 0.0):
        if isinstance(two_step, bool) or not isinstance(two_step, int | float) or not 0 <= two_step <= 1:
            raise ValueError(f"two_step must be a share in [0, 1], got {two_step!r}")
        if not isinstance(distractors, bool):
            raise ValueError(f"distractors must be true or false, got {distractors!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 2:
            raise ValueError(f"max_turns must be an integer of at least 2 (a tool call and an answer), "
                             f"got {max_turns!r}")
        if isinstance(max_number, bool) or not isinstance(max_number, int) \
                or not MIN_NUMBER < max_number <= 999:
            raise ValueError(f"max_number must be an integer in {MIN_NUMBER + 1}..999 (numbers are "
                             f"{MIN_NUMBER}..max_number), got {max_number!r}")
        if isinstance(expert_error, bool) or not isinstance(expert_error, int | float) \
                or not 0 <= expert_error <= 1:
            raise ValueError(f"expert_error must be a share in [0, 1], got {expert_error!r}")
        self.two_step = float(two_step)
        self.expert_error = float(expert_error)
        self.distractors = distractors
        self.max_turns = max_turns
        self.max_number = max_number
        self._one_step = [t for t in TEMPLATES if t.kind == "one" or (distractors and t.kind == "distractor")]
        self._two_step = [t for t in TEMPLATES if t.kind == "two"]
        self._answer: int | None = None
        self._turns = 0

    def task(self, rng: random.Random) -> str:
        template = rng.choice(self._two_step if rng.random() < self.two_step else self._one_step)
        name = rng.choice(list(NAMES))
        obj = rng.choice(OBJECTS)
        fields = {"name": name, "obj": obj, "obj2": rng.choice([o for o in OBJECTS if o != obj])}
        while True:  # draw the numbers again until the answer is not negative
            fields.update({f: rng.randint(MIN_NUMBER, self.max_number) for f in NUMBER_FIELDS})
            if evaluate(template.expr.format(**fields)) >= 0:
                return _render(template, fields)

    def reset(self, prompt: str) -> str:
        self._answer = self._solve(prompt)[1]
        self._turns = 0
        return prompt + FORMAT

    @property
    def expert_may_lose(self) -> bool:
        """The warm-up's protocol: an expert careless on purpose is not a broken one."""
        return self.expert_error > 0

    def demonstration(self, prompt: str) -> list[str]:
        """An expert's actions for this prompt: one tool call, then its result as the answer.

        On a share `expert_error` of prompts (the same ones on every call: drawn from the
        prompt's text) the expert is careless: its call applies the wrong operation to the
        right numbers (the first of + - * becomes - + +), and it answers that call's result.
        A warm-up on such demonstrations learns the format and the copying exactly, but the
        operation only as often as the expert got it right: what RL, rewarded for the right
        answer, is left to learn (a teacher weaker than the task, as a pretrained model's
        fine-tuning data often is).
        """
        expr, answer = self._solve(prompt)
        if self.expert_error and random.Random(f"expert:{prompt}").random() < self.expert_error:
            expr = re.sub(r"[-+*]", lambda op: CARELESS[op.group()], expr, count=1)
            answer = evaluate(expr)
        return [f"<calc>{_spaced(expr)}</calc>", f"<answer> {answer}</answer>"]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self._turns += 1
        out_of_turns = self._turns >= self.max_turns
        calc, answer = action.find("<calc>"), action.find("<answer>")
        if calc >= 0 and answer >= 0:
            return self._error("both <calc> and <answer> tags: write one per turn", out_of_turns)
        if calc < 0 and answer < 0:
            return self._error("no <calc> or <answer> tag", out_of_turns)
        tag, start = ("calc", calc) if calc >= 0 else ("answer", answer)
        start += len(tag) + 2
        end = action.find(f"</{tag}>", start)
        if end < 0:
            return self._error(f"unclosed <{tag}> tag: end it with </{tag}>", out_of_turns)
        content = action[start:end]
        if not content.strip():
            return self._error(f"empty <{tag}> tag", out_of_turns)
        if tag == "answer":
            if not re.fullmatch(r"\s*-?\d{1,20}\s*", content):
                return self._error(f"bad answer {content!r}: expected an integer", out_of_turns)
            won = int(content) == self._answer
            return "", float(won), True, {"success": won}
        try:
            value = evaluate(content)
        except ExpressionError as e:
            return self._error(f"bad expression {content!r}: {e}", out_of_turns)
        if len(str(abs(value))) > MAX_DIGITS:
            return self._error(f"bad expression {content!r}: its value has more than {MAX_DIGITS} digits",
                               out_of_turns)
        return f"<result> {value}</result>", 0.0, out_of_turns, {"success": False}

    @staticmethod
    def _error(message: str, done: bool) -> tuple[str, float, bool, dict]:
        return f"<error>{message}</error>", 0.0, done, {"success": False}

    def _solve(self, prompt: str) -> tuple[str, int]:
        """The expert's expression for a prompt, and its value: the answer."""
        for template, regex in zip(TEMPLATES, REGEXES, strict=True):
            match = regex.fullmatch(prompt)
            if match is None:
                continue
            fields = {k: v for k, v in match.groupdict().items() if k not in ("P", "p")}  # from the name
            for field in NUMBER_FIELDS:
                if field in fields:
                    fields[field] = int(fields[field])
            if _render(template, fields) != prompt or ("obj2" in fields and fields["obj2"] == fields["obj"]):
                continue  # a pronoun that is not the name's, a leading zero, a distractor of the same objects
            numbers = [fields[f] for f in NUMBER_FIELDS if f in fields]
            if not all(MIN_NUMBER <= n <= self.max_number for n in numbers):
                raise ValueError(f"not a word problem of this environment: its numbers must be in "
                                 f"{MIN_NUMBER}..{self.max_number}: {prompt!r}")
            if template.kind == "two" and self.two_step == 0:
                raise ValueError(f"not a word problem of this environment: two-step problems are off "
                                 f"(two_step=0): {prompt!r}")
            if template.kind == "distractor" and not self.distractors:
                raise ValueError(f"not a word problem of this environment: distractors are off: {prompt!r}")
            expr = template.expr.format(**fields)
            answer = evaluate(expr)
            if answer < 0:
                raise ValueError(f"not a word problem of this environment: its answer is negative: "
                                 f"{prompt!r}")
            return expr, answer
        raise ValueError(f"not a word problem: {prompt!r}")
