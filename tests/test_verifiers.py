import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.rl.verifiers import _too_costly, extract_boxed, gsm8k_gold, math_reward

ROOT = Path(__file__).resolve().parents[1]


# --- extract_boxed -----------------------------------------------------------------------------------


def test_extract_boxed():
    assert extract_boxed(r"so \boxed{72}.") == "72"
    assert extract_boxed(r"\boxed{\frac{\sqrt{2}}{2}}") == r"\frac{\sqrt{2}}{2}"  # nested braces
    assert extract_boxed(r"first \boxed{1} then \boxed{2}") == "2"  # last box wins
    assert extract_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped braces do not count
    assert extract_boxed("no box here") is None
    assert (
        extract_boxed(r"\boxed{1} and a truncated \boxed{\frac{1}{2") is None
    )  # last box unclosed
    assert extract_boxed("") is None


def test_extract_boxed_hostile_is_bounded():
    for text in [
        "\\boxed{" + "{" * 1_000_000,
        "\\boxed{" * 200_000,
        "x" * 5_000_000 + "\\boxed{7}",
    ]:
        t0 = time.perf_counter()
        extract_boxed(text)
        assert time.perf_counter() - t0 < 0.5
    assert (
        extract_boxed("\\boxed{7}" + "x" * 20_000) is None
    )  # only the last 10k chars are searched


# --- gsm8k_gold --------------------------------------------------------------------------------------


def test_gsm8k_gold():
    assert gsm8k_gold("blah #### 1,234") == "1234"
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert gsm8k_gold("  -5 ") == "-5"


# --- math_reward -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,gold,expected",
    [
        (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # bare LaTeX gold
        (r"\boxed{72}", "72", 1.0),
        (r"\boxed{72}", gsm8k_gold("... #### 72"), 1.0),
        (r"\boxed{1,234}", gsm8k_gold("blah #### 1,234"), 1.0),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}", 1.0),
        (r"\boxed{1024}", "2^{10}", 1.0),
        (r"\boxed{\$5}", r"\$5", 1.0),
        (r"\boxed{71}", "72", 0.0),  # wrong answer
        (r"\boxed{-3}", "3", 0.0),
        (r"\boxed{2}", "2^{10}", 0.0),  # a bare gold parse would read 2^{10} as 2
        ("The answer is 72", "72", 0.0),  # no box
        (r"\boxed{72} wait, no: \boxed{71}", "72", 0.0),  # last box wins
        (r"\boxed{71} wait, no: \boxed{72}", "72", 1.0),
        (r"\boxed{}", "72", 0.0),
        (r"\boxed{\frac{", "72", 0.0),
    ],
)
def test_math_reward(text, gold, expected):
    assert math_reward(text, gold) == expected


def test_math_reward_in_worker_thread():
    # math-verify's signal.alarm timeout only works in the main thread; off it we must disable it.
    results = {}

    def work():
        results["right"] = math_reward(r"\boxed{\frac{1}{2}}", "0.5")
        results["wrong"] = math_reward(r"\boxed{3}", "0.5")

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=60)
    assert results == {"right": 1.0, "wrong": 0.0}


def test_never_raises():
    assert math_reward(r"\boxed{\frac{1}{0}}", "72") == 0.0
    assert math_reward(r"\boxed{)(}", "72") == 0.0
    assert math_reward(r"\boxed{72}", "") == 0.0
    assert math_reward(r"\boxed{72}", None) == 0.0  # type: ignore[arg-type]


# --- answers that would hang sympy without a timeout -------------------------------------------------

HOSTILE = [
    r"9^{9^{9^{9}}}",
    r"9^9^9",
    r"10^{10^{10}}",
    r"(2^{100000})!",
    r"9999999999^{9999999}",
    r"99!!!",
    r"(10^{6})!",
    r"\binom{10^{9}}{10^{8}}",
    r"\binom{9999999}{4999999}",
    r"\Gamma(99999999)",
    r"9**9**9",
    r"{10^{9999}}^{9999}",
    r"\prod_{i=1}^{999999999} i",
]


def test_too_costly_screen():
    assert all(_too_costly(a) for a in HOSTILE)
    for ok in [
        r"2^{10}",
        r"x^2+y^2",
        r"5!",
        r"\frac{10!}{3!7!}",
        r"10,\!000",
        r"\binom{10}{3}",
        r"3^{2017}",
        r"\frac{\sqrt{2}}{2}",
        r"e^{i\pi}",
        r"\sum_{k=1}^{n} k^2",
    ]:
        assert not _too_costly(ok), ok


def test_hostile_answers_in_worker_thread_do_not_hang():
    # Off the main thread there is no timeout and a hang would hold the GIL, so run in a subprocess.
    code = (
        "import threading, sys\n"
        "from common.rl.verifiers import math_reward\n"
        f"answers = {HOSTILE!r}\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.extend(math_reward('\\\\boxed{' + a + '}', '72') for a in answers))\n"
        "t.start(); t.join()\n"
        "assert out == [0.0] * len(answers), out\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
