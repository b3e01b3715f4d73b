"""Active 4PC's input plan (ppfs.step2a.input_plan): honest inputs give the value and
pass every check; any one party that inputs something else fails one. (Active 3PC
has no plan: it reads its shares as they are, tests/test_engine_mpspdz.py.)"""

from __future__ import annotations

import itertools
import secrets

import pytest

from ppfs.errors import ParameterError
from ppfs.step2a import InputPlan, Security, input_plan

MOD = 1 << 64
ACTIVE = [Security.ACTIVE_4PC]


def _inputs(plan: InputPlan, comps: list[int]) -> list[int]:
    return [sum(comps[j] for j in item.components) % MOD for item in plan.items]


def _checks(plan: InputPlan, inputs: list[int]) -> list[int]:
    return [sum(sign * inputs[i] for i, sign in check) % MOD for check in plan.checks]


@pytest.mark.parametrize("security", ACTIVE, ids=lambda s: s.value)
def test_each_party_inputs_only_what_it_holds(security: Security) -> None:
    plan = input_plan(security)
    for item in plan.items:
        assert set(item.components) <= set(security.scheme.components_of(item.party))
        assert len(set(item.components)) == len(item.components)
    assert {item.party for item in plan.items} == set(range(security.parties))


@pytest.mark.parametrize("security", ACTIVE, ids=lambda s: s.value)
def test_honest_inputs_give_the_value_and_pass_every_check(security: Security) -> None:
    plan = input_plan(security)
    for _ in range(200):
        comps = [secrets.randbelow(MOD) for _ in range(security.parties)]
        inputs = _inputs(plan, comps)
        assert sum(inputs[i] for i in plan.total) % MOD == sum(comps) % MOD
        assert _checks(plan, inputs) == [0] * len(plan.checks)


def _deviations(n: int) -> list[tuple[int, ...]]:
    """Nonzero deviation vectors of n inputs: every combination of 0, 1, -1, 2^63 and
    2^62 (the high-valuation ones a parity argument would miss), and random ones."""
    base = [0, 1, MOD - 1, 1 << 63, 1 << 62, 3 << 62]
    out = [d for d in itertools.product(base, repeat=n) if any(d)]
    out += [tuple(secrets.randbelow(MOD) for _ in range(n)) for _ in range(200)]
    out += [tuple(secrets.randbelow(2) << 63 for _ in range(n)) for _ in range(20)]
    return [d for d in out if any(d)]


@pytest.mark.parametrize("security", ACTIVE, ids=lambda s: s.value)
def test_any_one_party_inputting_something_else_fails_a_check(security: Security) -> None:
    plan = input_plan(security)
    comps = [secrets.randbelow(MOD) for _ in range(security.parties)]
    honest = _inputs(plan, comps)
    for party in range(security.parties):
        own = [i for i, item in enumerate(plan.items) if item.party == party]
        for dev in _deviations(len(own)):
            inputs = list(honest)
            for i, d in zip(own, dev, strict=True):
                inputs[i] = (inputs[i] + d) % MOD
            assert any(_checks(plan, inputs)), (security.value, party, dev)


@pytest.mark.parametrize("security", ACTIVE, ids=lambda s: s.value)
def test_checks_pin_each_party_mod_2(security: Security) -> None:
    # the reason no deviation passes: restricted to one party's items, the checks'
    # coefficients form a matrix of full column rank mod 2 (Gaussian elimination over
    # GF(2)), so a deviation with lowest set bit t leaves some check nonzero at bit t
    plan = input_plan(security)
    for party in range(security.parties):
        own = [i for i, item in enumerate(plan.items) if item.party == party]
        rows = [[dict(check).get(i, 0) % 2 for i in own] for check in plan.checks]
        rank = 0
        for col in range(len(own)):
            pivot = next((r for r in range(rank, len(rows)) if rows[r][col]), None)
            if pivot is None:
                continue
            rows[rank], rows[pivot] = rows[pivot], rows[rank]
            for r in range(len(rows)):
                if r != rank and rows[r][col]:
                    rows[r] = [a ^ b for a, b in zip(rows[r], rows[rank], strict=True)]
            rank += 1
        assert rank == len(own), (security.value, party)


def test_active_plan_takes_fewer_inputs_than_two_copies() -> None:
    # two copies of each component: 8 inputs and 4 checks in 4PC
    p4 = input_plan(Security.ACTIVE_4PC)
    assert (len(p4.items), len(p4.checks)) == (4, 1)


def test_other_settings_have_no_plan() -> None:
    for security in (Security.PASSIVE_3PC, Security.ACTIVE_3PC, Security.PASSIVE_4PC):
        with pytest.raises(ParameterError, match="no share components"):
            input_plan(security)
