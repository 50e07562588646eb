"""A safe calculator for the Calc-X agent: arithmetic expressions evaluated from their syntax tree, never with
``eval``. Exact where possible (integers and fractions stay exact), with limits that stop runaway inputs."""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

Number = int | float | Fraction

MAX_EXPRESSION_LENGTH = 500
MAX_EXPONENT = 10_000
MAX_DIGITS = 1_000


class CalculatorError(ValueError):
    """The expression is not something the calculator evaluates; the message says why."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "floor": math.floor,
    "ceil": math.ceil,
    "log": math.log,
    "exp": math.exp,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%(?!\s*[\d(.])")


def evaluate(expression: str) -> Number:
    """The value of an arithmetic ``expression`` (``+ - * / // % **``, parentheses, ``sqrt abs round min max floor
    ceil log exp``, ``pi``, ``e``; ``^`` means power, ``,`` thousands separators and ``$``/``%`` signs are
    accepted). Raises :class:`CalculatorError` with the reason for anything else."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = _normalise(expression)
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot parse {expression!r}: {exc.msg}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError(f"division by zero in {expression!r}") from None
    except CalculatorError:
        raise
    except (OverflowError, ValueError, TypeError) as exc:
        raise CalculatorError(f"cannot evaluate {expression!r}: {exc}") from None


def format_number(value: Number) -> str:
    """A readable result: integers plainly, fractions as ``a/b = around x``, floats to 10 significant digits."""
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        if _terminates(value.denominator):
            return _decimal(value)
        return f"{value.numerator}/{value.denominator} = around {float(value):.6g}"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result as text, e.g. ``calculate("(12 + 8) * 3")``."""
    return format_number(evaluate(expression))


def _terminates(denominator: int) -> bool:
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator == 1


def _decimal(value: Fraction) -> str:
    """Exact decimal text of a fraction whose denominator has only the factors 2 and 5."""
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    scaled = abs(value.numerator * 10**places // value.denominator)
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _normalise(expression: str) -> str:
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/").replace("$", "")
    # Thousands separators (1,234) but not argument separators (max(1, 2)).
    out = []
    for index, char in enumerate(text):
        if (
            char == ","
            and 0 < index < len(text) - 3
            and text[index - 1].isdigit()
            and text[index + 1 : index + 4].isdigit()
            and (index + 4 == len(text) or not text[index + 4].isdigit())
        ):
            continue
        out.append(char)
    text = "".join(out)
    # A percent sign after a number, not followed by another operand, means hundredths: 15% -> (15/100).
    return _PERCENT.sub(r"(\1/100)", text)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"unsupported literal {node.value!r}")
        # Decimal literals become exact fractions so that 0.1 + 0.2 is 0.3, not 0.30000000000000004.
        return _exact(Fraction(repr(node.value))) if isinstance(node.value, float) else node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div):
            return _exact(Fraction(left) / Fraction(right)) if _is_exact(left, right) else left / right
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise CalculatorError(f"unknown function {name!r}; available: {', '.join(sorted(_FUNCTIONS))}")
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes no keyword arguments")
        arguments = [_eval(argument) for argument in node.args]
        if node.func.id in ("sqrt", "log", "exp"):
            arguments = [float(argument) for argument in arguments]
        return _exact(_FUNCTIONS[node.func.id](*arguments))
    raise CalculatorError(f"unsupported syntax {ast.unparse(node)!r}")


def _is_exact(*values: Number) -> bool:
    return all(isinstance(value, (int, Fraction)) for value in values)


def _exact(value: Any) -> Number:
    if isinstance(value, Fraction) and value.denominator == 1:
        return value.numerator
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent} is too large (limit {MAX_EXPONENT})")
    if isinstance(exponent, Fraction) and exponent.denominator != 1:
        exponent = float(exponent)
        base = float(base)
    elif isinstance(exponent, Fraction):
        exponent = exponent.numerator
    if _is_exact(base) and isinstance(exponent, int):
        if base not in (0, 1, -1) and abs(exponent) * math.log10(max(2, abs(float(base)))) > MAX_DIGITS:
            raise CalculatorError(f"result of {base}**{exponent} has more than {MAX_DIGITS} digits")
        return _exact(Fraction(base) ** exponent)
    return _check_size(base**exponent)


def _check_size(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_DIGITS * 4:
        raise CalculatorError(f"result has more than about {MAX_DIGITS} digits")
    if isinstance(value, Fraction):
        return _exact(value)
    return value
