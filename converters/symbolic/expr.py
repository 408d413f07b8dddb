"""Cheap symbolic dimensions: sums of monomials with rational coefficients.

An :class:`Expr` is a polynomial in named symbols (``B``, ``S``, ``H``, ``tp``, …) with integer
(possibly negative) exponents, so products and quotients of symbols are exact: ``2*B*S*H/tp``.
It is stored as a dict ``{monomial: coefficient}`` where a monomial is a sorted tuple of
``(symbol, exponent)`` pairs and the coefficient a :class:`fractions.Fraction`. That is all the
algebra synthesis needs (shapes, FLOPs, bytes, partition by parallel degrees); no simplifier,
no solver, no sympy. Division is defined by a single monomial (``(2*H + 2*G)/tp``), not by a sum.

:func:`parse` reads the small expression language of templates (names, integers, ``+ - * / **``,
parentheses) with Python's ``ast`` — nothing is ever evaluated by Python itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from fractions import Fraction
from functools import lru_cache

Monomial = tuple[tuple[str, int], ...]
Number = int | Fraction


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    if not a:
        return b
    if not b:
        return a
    d = dict(a)
    for s, p in b:
        q = d.get(s, 0) + p
        if q:
            d[s] = q
        else:
            d.pop(s, None)
    return tuple(sorted(d.items()))


class Expr:
    """A polynomial with rational coefficients in symbols with integer exponents (immutable)."""

    __slots__ = ("_hash", "terms")

    def __init__(self, terms: Mapping[Monomial, Fraction] | None = None) -> None:
        self.terms: dict[Monomial, Fraction] = {m: c for m, c in (terms or {}).items() if c}
        self._hash: int | None = None

    # ---- construction ----------------------------------------------------------------------
    @staticmethod
    def const(v: Number) -> Expr:
        """The constant ``v``."""
        return Expr({(): Fraction(v)})

    @staticmethod
    def sym(name: str) -> Expr:
        """The symbol ``name``."""
        return Expr({((name, 1),): Fraction(1)})

    @staticmethod
    def of(v: Expr | Number | str) -> Expr:
        """Coerce a number, an expression string or an Expr."""
        if isinstance(v, Expr):
            return v
        if isinstance(v, str):
            return parse(v)
        return Expr.const(v)

    # ---- arithmetic ------------------------------------------------------------------------
    def __add__(self, other: Expr | Number) -> Expr:
        o = Expr.of(other)
        t = dict(self.terms)
        for m, c in o.terms.items():
            t[m] = t.get(m, Fraction(0)) + c
        return Expr(t)

    __radd__ = __add__

    def __neg__(self) -> Expr:
        return Expr({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Expr | Number) -> Expr:
        return self + (-Expr.of(other))

    def __rsub__(self, other: Expr | Number) -> Expr:
        return Expr.of(other) - self

    def __mul__(self, other: Expr | Number) -> Expr:
        o = Expr.of(other)
        t: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                m = _mono_mul(m1, m2)
                t[m] = t.get(m, Fraction(0)) + c1 * c2
        return Expr(t)

    __rmul__ = __mul__

    def __truediv__(self, other: Expr | Number) -> Expr:
        o = Expr.of(other)
        if len(o.terms) != 1:
            raise ZeroDivisionError(f"cannot divide by {o} (only by a single monomial)")
        (m, c), = o.terms.items()
        inv = tuple((s, -p) for s, p in m)
        return self * Expr({inv: 1 / c})

    def __rtruediv__(self, other: Expr | Number) -> Expr:
        return Expr.of(other) / self

    def __pow__(self, k: int) -> Expr:
        if not isinstance(k, int):
            raise TypeError("only integer powers")
        if k < 0:
            return Expr.const(1) / (self ** (-k))
        out = Expr.const(1)
        for _ in range(k):
            out = out * self
        return out

    # ---- inspection ------------------------------------------------------------------------
    @property
    def symbols(self) -> frozenset[str]:
        """Every symbol the expression mentions."""
        return frozenset(s for m in self.terms for s, _ in m)

    def is_const(self) -> bool:
        """True when no symbol appears."""
        return all(not m for m in self.terms)

    def subs(self, env: Mapping[str, Number | Expr]) -> Expr:
        """Substitute some symbols (numbers or expressions)."""
        out = Expr()
        for m, c in self.terms.items():
            term = Expr.const(c)
            for s, p in m:
                v = env.get(s)
                term = term * (Expr.sym(s) ** p if v is None else Expr.of(v) ** p)
            out = out + term
        return out

    def value(self, env: Mapping[str, Number]) -> Fraction:
        """Exact value with every symbol bound in ``env`` (KeyError names a missing one)."""
        total = Fraction(0)
        for m, c in self.terms.items():
            v = c
            for s, p in m:
                if s not in env:
                    raise KeyError(f"symbol {s!r} has no value (in {self})")
                v *= Fraction(env[s]) ** p
            total += v
        return total

    def int_value(self, env: Mapping[str, Number]) -> int:
        """Value as an int; ``ValueError`` if it is not a whole number (a dimension that does not divide)."""
        v = self.value(env)
        if v.denominator != 1:
            raise ValueError(f"{self} = {v} is not a whole number with {dict(env)}")
        return int(v)

    # ---- comparison, printing ---------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (int, Fraction, str)):
            other = Expr.of(other)
        return isinstance(other, Expr) and self.terms == other.terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self.terms.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"Expr({str(self)!r})"

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for m, c in sorted(self.terms.items(), key=lambda kv: (-len(kv[0]), kv[0])):
            num = [s if p == 1 else f"{s}**{p}" for s, p in m if p > 0]
            den = [s if p == -1 else f"{s}**{-p}" for s, p in m if p < 0]
            cn, cd = c.numerator, c.denominator
            sign = "-" if cn < 0 else "+"
            cn = abs(cn)
            head = "*".join(([str(cn)] if cn != 1 or not num else []) + num)
            if cd != 1:
                den = [str(cd)] + den
            txt = head + ("/" + "/".join(den) if den else "")
            parts.append((sign, txt))
        out = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        for sign, txt in parts[1:]:
            out += f" {sign} {txt}"
        return out


_BINOPS = {ast.Add: "__add__", ast.Sub: "__sub__", ast.Mult: "__mul__", ast.Div: "__truediv__"}


def _from_ast(node: ast.AST, text: str) -> Expr:
    if isinstance(node, ast.Expression):
        return _from_ast(node.body, text)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Expr.const(node.value)
    if isinstance(node, ast.Name):
        return Expr.sym(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _from_ast(node.operand, text)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            exp = node.right
            if not (isinstance(exp, ast.Constant) and isinstance(exp.value, int)):
                raise ValueError(f"in {text!r}: only integer constant exponents")
            return _from_ast(node.left, text) ** exp.value
        name = _BINOPS.get(type(node.op))
        if name is None:
            raise ValueError(f"in {text!r}: operator {type(node.op).__name__} not allowed")
        return getattr(_from_ast(node.left, text), name)(_from_ast(node.right, text))
    raise ValueError(f"in {text!r}: {ast.dump(node)[:60]} is not allowed (names, integers, + - * / ** only)")


@lru_cache(maxsize=4096)
def parse(text: str) -> Expr:
    """Parse ``text`` (``"(2*H + 2*G)/tp"``) into an :class:`Expr`; ``ValueError`` on anything else."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"cannot parse expression {text!r}: {e.msg}") from None
    return _from_ast(tree, text)


def product(items: Iterable[Expr | Number | str]) -> Expr:
    """Product of several expressions."""
    out = Expr.const(1)
    for x in items:
        out = out * Expr.of(x)
    return out


ONE = Expr.const(1)
ZERO = Expr()
