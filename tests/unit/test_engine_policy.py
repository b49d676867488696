"""The load-following budget policy: explores each tree size, takes the best measured
throughput per batch size, drops to ar only when ar wins clearly; `auto` rows in the
engine stay exact whatever the policy picks."""

from __future__ import annotations

import pytest
import torch

from ddtree.engine import EngineConfig, GenerationRequest, SpecParams, generate
from ddtree.engine.core import POLICY_REPEATS
from ddtree.engine.generate import build_engine
from ddtree.engine.policy import (
    AR_EVIDENCE_ROUNDS,
    AR_MIN_SAMPLES,
    COST_WINDOW,
    MIN_SAMPLES,
    ROUND_SAMPLES,
    STALE_TAU_FACTOR,
    TAU_WEIGHT,
    TREE_MARGIN,
    BudgetPolicy,
    accepted_within,
    tree_margin,
)
from ddtree.engine.timing import round_cost
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair


def path_for(policy: BudgetPolicy, tau: dict[int, float], choice: int) -> list[int]:
    """An accepted path (node indices, root first) of a `choice`-node round along which
    every tree size n <= choice accepts round(tau[n]) tokens (the chain: tau[depth])."""
    if choice == policy.depth:
        return list(range(round(tau[choice])))
    path, below = [0], 0
    for size in (c for c in policy.choices if c != policy.depth and c <= choice):
        path += range(below + 1, below + 1 + round(tau[size]) - len(path))
        below = size
    return path


def feed(policy: BudgetPolicy, batch: int, cost: dict[int, float], tau: dict[int, float],
         rounds: int, rows: int = 2) -> list[int]:
    """Runs `rounds` decisions, answering each with the given cost and acceptance."""
    picks = []
    for _ in range(rounds):
        policy.tick()
        choice = policy.choose(batch)
        picks.append(choice)
        policy.observe(batch, choice, cost[choice], choice,
                       [path_for(policy, tau, choice)] * rows)
    return picks


def test_a_round_tells_every_smaller_nested_tree_its_acceptance() -> None:
    """Tree nodes are numbered best first and a smaller tree is the larger one's first
    nodes: along an accepted path, a tree of n nodes would have accepted the root and the
    leading nodes numbered <= n."""
    assert accepted_within([0, 1, 5, 20, 40], 64) == 5
    assert accepted_within([0, 1, 5, 20, 40], 32) == 4
    assert accepted_within([0, 1, 5, 20, 40], 16) == 3
    assert accepted_within([0, 20], 16) == 1  # the root alone: the bonus token
    policy = BudgetPolicy(depth=15, max_budget=64)
    policy.observe(1, 63, 1.0, 63, [[0, 1, 5, 20, 40]])
    assert policy.snapshot()["tau"] == {"16": {"tau": 3.0, "rounds": 1},
                                        "32": {"tau": 4.0, "rounds": 1},
                                        "63": {"tau": 5.0, "rounds": 1}}
    policy.observe(1, 15, 1.0, 15, [[0, 1, 2]])  # the chain is not nested with the trees
    assert policy.snapshot()["tau"]["15"] == {"tau": 3.0, "rounds": 1}  # type: ignore[index]


def test_every_size_is_measured_first_then_the_best_throughput_wins() -> None:
    policy = BudgetPolicy(depth=15, max_budget=64)
    assert policy.choices == (15, 16, 32, 63)
    cost = {15: 1.0, 16: 1.1, 32: 1.2, 63: 2.0}
    tau = {15: 2.0, 16: 2.0, 32: 3.0, 63: 4.0}  # per unit cost: 2.0, 1.8, 2.5, 2.0
    picks = feed(policy, 1, cost, tau, 4 * MIN_SAMPLES + 10)
    assert sorted(set(picks[: 4 * MIN_SAMPLES])) == [15, 16, 32, 63]
    assert picks[4 * MIN_SAMPLES:] == [32] * 10
    assert not policy.prefers_ar(1)
    # Another batch size is measured on its own: there the chain wins.
    busy = {15: 1.0, 16: 1.5, 32: 2.5, 63: 5.0}
    assert feed(policy, 8, busy, tau, 4 * MIN_SAMPLES + 5)[-5:] == [15] * 5


def test_with_measured_costs_only_the_largest_tree_and_the_chain_are_explored() -> None:
    """The largest tree's rounds give every smaller tree its acceptance at the same places
    of the same answers; then the best throughput runs."""
    policy = BudgetPolicy(depth=15, max_budget=64)
    for choice, cost in {0: 1.0, 15: 1.5, 16: 1.5, 32: 1.6, 63: 2.4}.items():
        policy.measure(1, choice, cost)
    tau = {15: 2.0, 16: 2.0, 32: 4.0, 63: 4.5}  # per unit cost: 1.33, 1.33, 2.5, 1.9
    picks = feed(policy, 1, {0: 1.0, 15: 1.5, 16: 1.5, 32: 1.6, 63: 2.4}, tau,
                 2 * MIN_SAMPLES + 5, rows=1)
    assert picks == [63] * MIN_SAMPLES + [15] * MIN_SAMPLES + [32] * 5


def test_trees_must_beat_ar_by_a_margin_once_every_size_was_measured() -> None:
    policy = BudgetPolicy(depth=7, max_budget=16)
    assert not policy.prefers_ar(4)  # nothing measured yet
    feed(policy, 4, {7: 1.0, 16: 1.2}, {7: 1.0, 16: 1.0}, 2 * MIN_SAMPLES)
    assert not policy.prefers_ar(4)  # the best tree's acceptance rests on 8 samples
    feed(policy, 4, {7: 1.0, 16: 1.2}, {7: 1.0, 16: 1.0}, AR_MIN_SAMPLES // 2)
    assert policy.prefers_ar(4)  # the prior: an ar round costs 0.7 of a chain round
    # The best tree (the chain: 1 token per 1.0) against ar measured at 1.3 (rate 0.77):
    policy.observe(4, 0, 1.3, 0, [])
    assert tree_margin(4) < 1.3
    assert not policy.prefers_ar(4)  # the chain is 1.3x ar: past the margin at 4 rows
    # Trees expected at 1.01x ar (the demo pair's tree@16 at batch 8 on the H200, which
    # served 0.78x ar in the load curve): ar.
    feed(policy, 8, {7: 1.0, 16: 2.0}, {7: 1.0, 16: 1.0}, 2 * MIN_SAMPLES)
    policy.observe(8, 0, 1.01, 0, [])
    assert policy.prefers_ar(8)


def test_ar_is_judged_again_on_fresh_acceptance_once_its_evidence_is_old() -> None:
    """A bucket that went to ar admits new auto rows as ar only while the acceptance it
    judged by is recent: later the rows draft again and the policy re-measures, where the
    trees were near ar (accepting STALE_TAU_FACTOR times as much would beat it)."""
    policy = BudgetPolicy(depth=7, max_budget=16)
    for choice, cost in {0: 1.0, 7: 2.0, 16: 2.2}.items():
        policy.measure(1, choice, cost)
    feed(policy, 1, {7: 2.0, 16: 2.2}, {7: 2.0, 16: 2.0}, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    assert policy.prefers_ar(1)  # the chain: 2 / 2.0 against ar's 1 / 1.0 x TREE_MARGIN
    for _ in range(AR_EVIDENCE_ROUNDS // 2):  # evidence this old still decides
        policy.tick()
    assert policy.prefers_ar(1)
    for _ in range(AR_EVIDENCE_ROUNDS // 2 + 1):  # ar rounds: no acceptance seen meanwhile
        policy.tick()
    assert not policy.prefers_ar(1)  # new rows draft: every size is tried again
    picks = feed(policy, 1, {7: 2.0, 16: 2.2}, {7: 4.0, 16: 4.0}, 2)
    assert set(picks) == {7, 16}
    assert not policy.prefers_ar(1)  # acceptance 4 now: 4 / 2.0 beats ar's 1 / 1.0


def test_old_evidence_keeps_ar_where_the_trees_lost_by_far() -> None:
    """Refreshing the evidence means tree rounds at that batch size: where the best tree
    would have to accept more than STALE_TAU_FACTOR times what it last did to beat ar
    (lease 39: at 32 rows a round of drafting rows cost 4-6x an ar round), old evidence
    still decides for ar; new evidence, from any batch size, is judged as ever."""
    policy = BudgetPolicy(depth=7, max_budget=16)
    for batch, costs in {1: {0: 1.0, 7: 1.2, 16: 1.3}, 32: {0: 1.0, 7: 4.0, 16: 4.4}}.items():
        for choice, cost in costs.items():
            policy.measure(batch, choice, cost)
    feed(policy, 1, {7: 1.2, 16: 1.3}, {7: 3.0, 16: 3.0}, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    assert not policy.prefers_ar(1) and policy.prefers_ar(32)  # 3 / 4.0 against 1 / 1.0
    for _ in range(AR_EVIDENCE_ROUNDS):
        policy.tick()
    assert 3.0 * STALE_TAU_FACTOR / 4.0 < tree_margin(32) * 1.0 / 1.0  # (the premise)
    assert policy.prefers_ar(32)  # even 1.5 x 3 / 4.0 loses to ar: no tree rounds at 32
    assert not policy.prefers_ar(1)  # where trees win, old evidence drafts (and refreshes)
    feed(policy, 1, {7: 1.2, 16: 1.3}, {7: 8.0, 16: 8.0}, 4 * AR_MIN_SAMPLES)
    assert not policy.prefers_ar(32)  # fresh acceptance 8 from batch 1: 8 / 4.0 wins


def test_the_margin_over_ar_grows_with_the_batch() -> None:
    """A batch of drafting rows drains behind its slowest row: the same expected gain per
    round that drafts at 1 row is ar at 8 (lease 40: tree@16 expected at 1.27x ar per round
    at 8 rows served 0.88x with all requests at once)."""
    assert tree_margin(1) == TREE_MARGIN
    assert tree_margin(1) < tree_margin(2) < tree_margin(8) < tree_margin(64)
    policy = BudgetPolicy(depth=7, max_budget=16)
    for batch in (1, 8):
        for choice, cost in {0: 1.0, 7: 1.5, 16: 1.6}.items():
            policy.measure(batch, choice, cost)
    # the best tree: 2.03 tokens per 1.6 = 1.27x ar's 1 per 1.0, as at 8 rows in lease 40
    feed(policy, 1, {7: 1.5, 16: 1.6}, {7: 1.0, 16: 2.03}, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    assert not policy.prefers_ar(1) and policy.prefers_ar(8)


def test_rows_of_one_round_weigh_as_at_most_round_samples() -> None:
    """32 rows that drafted in one round, all at their answers' easy openings, move the
    acceptance as ROUND_SAMPLES samples would, not as 32 rounds of one row."""
    policy = BudgetPolicy(depth=7, max_budget=16)
    for _ in range(2 * AR_MIN_SAMPLES):  # one row a round: one sample each
        policy.observe(1, 16, 1.0, 16, [path_for(policy, {7: 2.0, 16: 2.0}, 16)])
    before = policy.snapshot()["tau"]["16"]
    policy.observe(32, 16, 1.0, 16, [path_for(policy, {7: 8.0, 16: 8.0}, 16)] * 32)
    after = policy.snapshot()["tau"]["16"]
    assert before == {"tau": 2.0, "rounds": 2 * AR_MIN_SAMPLES}
    assert after["rounds"] == before["rounds"] + 32  # evidence: every row
    expected = 2.0 + (1 - (1 - TAU_WEIGHT) ** ROUND_SAMPLES) * (8.0 - 2.0)
    assert after["tau"] == pytest.approx(expected, abs=1e-3)
    assert after["tau"] < 2.6  # 32 samples would have moved it to ~5.2


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tiny-policy")
    make_tiny_pair(root, family="llama")
    return load_pair(root / "target", root / "drafter", torch.device("cpu"), torch.float32)


def test_auto_rows_stay_exact_and_a_useless_drafter_ends_in_ar(pair) -> None:
    """The tiny pair's drafter is random (acceptance ~1): after measuring every tree size
    the policy moves the auto rows to ar; their tokens are the ar tokens throughout."""
    target, drafter = pair
    prompt = [5, 6, 7, 8, 9]
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=2, max_model_len=160,
                                                        max_budget=32))
    for i in range(2):
        engine.add_request(f"auto{i}", GenerationRequest(prompt, 120, spec=SpecParams("auto"),
                                                         ignore_eos=True))
    tokens: dict[str, list[int]] = {"auto0": [], "auto1": []}
    sizes = []
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
        sizes.append(sorted(row.num_nodes for row in engine.running.values()))
    reference = [t for r, _ in generate(target, None, GenerationRequest(
        prompt, 120, spec=SpecParams("ar"), ignore_eos=True)) for t in r.new_tokens]
    assert tokens["auto0"] == reference and tokens["auto1"] == reference
    assert {7, 16, 32} <= {n for s in sizes for n in s}  # every size was tried
    assert [s for s in sizes if s][-1] == [0, 0]  # and it ended in ar


def test_measured_costs_leave_only_acceptance_to_explore_and_judge_ar_by_its_cost() -> None:
    policy = BudgetPolicy(depth=15, max_budget=64)
    # Costs as the engine measures them (a round per choice, graphs on scratch rows):
    # at batch 1 a tree pays, at batch 64 ar's round is far cheaper than any tree's.
    for batch, costs in ((1, {0: 1.0, 15: 1.5, 16: 1.6, 32: 1.7, 63: 2.2}),
                         (64, {0: 1.7, 15: 8.0, 16: 8.5, 32: 13.0, 63: 24.0})):
        for choice, cost in costs.items():
            policy.measure(batch, choice, cost)
        assert policy.is_measured(batch)
    tau = {15: 2, 16: 2, 32: 3, 63: 3}
    picks = []
    for _ in range(4 * MIN_SAMPLES):  # acceptance is explored once, at batch 1, ...
        choice = policy.choose(1)
        picks.append(choice)
        policy.observe(1, choice, 1.6, choice,
                       [path_for(policy, tau, choice)] * AR_MIN_SAMPLES)  # many rows
    # ... by the largest tree and the chain; traffic costs every tree 1.6: 3 / 1.6 is best
    assert picks[:2] == [63, 15] and set(picks[2:]) <= {32, 63}
    assert policy.choose(1) in (32, 63)
    assert policy.choose(64) == 15  # not explored again at batch 64: the chain is best there
    assert not policy.prefers_ar(1)
    assert policy.prefers_ar(64)  # measured: 1 / 1.7 against 2 / 8 per row
    assert not policy.is_measured(8)
    # Traffic overrides a measurement that was too kind to the trees (empty scratch rows).
    for choice, cost in {0: 1.0, 15: 1.1, 16: 1.1, 32: 1.2, 63: 1.3}.items():
        policy.measure(8, choice, cost)
    assert not policy.prefers_ar(8)
    for choice in policy.choices:
        for _ in range(MIN_SAMPLES):
            policy.observe(8, choice, 4.0, choice, [path_for(policy, tau, choice)])
    assert policy.prefers_ar(8)  # 1 / 1.0 against 3 / 4.0


def test_auto_rows_with_measured_costs_stay_exact_and_a_useless_drafter_ends_in_ar(
        pair) -> None:
    """The engine times every choice at each batch bucket it sees (eagerly on the CPU),
    here while a row is decoding (the bucket grows from 1 to 4); tokens are the ar tokens
    whatever the policy then picks, and the random drafter's rows end in ar."""
    target, drafter = pair
    prompt = [5, 6, 7, 8, 9]
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=4, max_model_len=160,
                                                        max_budget=32, measure_policy=True))
    tokens: dict[str, list[int]] = {f"auto{i}": [] for i in range(3)}
    sizes = []
    assert engine.policy is not None
    measured: dict[int, float] = {}  # batch -> seconds its measurement took
    observed: list[tuple[int, float]] = []
    measure, observe = engine.policy.measure, engine.policy.observe

    def record_measure(batch: int, choice: int, seconds: float) -> None:
        measured[batch] = measured.get(batch, 0.0) + seconds * (POLICY_REPEATS + 1)
        measure(batch, choice, seconds)

    def record_observe(batch: int, num_nodes: int, seconds: float, choice: int,
                       paths: list[list[int]]) -> None:
        observed.append((batch, seconds))
        observe(batch, num_nodes, seconds, choice, paths)

    engine.policy.measure = record_measure  # type: ignore[method-assign]
    engine.policy.observe = record_observe  # type: ignore[method-assign]
    engine.add_request("auto0", GenerationRequest(prompt, 60, spec=SpecParams("auto"),
                                                  ignore_eos=True))
    for step in range(200):
        if step == 6:  # joins a running row: bucket 4 is measured mid-traffic
            for i in (1, 2):
                engine.add_request(f"auto{i}", GenerationRequest(
                    prompt, 60, spec=SpecParams("auto"), ignore_eos=True))
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
        sizes.append(sorted(row.num_nodes for row in engine.running.values()))
        if not engine.has_work:
            break
    reference = [t for r, _ in generate(target, None, GenerationRequest(
        prompt, 60, spec=SpecParams("ar"), ignore_eos=True)) for t in r.new_tokens]
    assert all(t == reference for t in tokens.values())
    assert engine.policy.is_measured(4)
    assert set([s for s in sizes if s][-1]) == {0}  # every row left ends in ar
    # No round whose wait spanned a measurement is taken as a traffic cost.
    assert observed and max(seconds for _, seconds in observed) < max(measured.values()) / 2


def test_auto_rows_admitted_together_start_as_ar_when_their_joint_bucket_prefers_ar(
        pair) -> None:
    """Judged at the bucket the step's admissions fill (4), not row by row (1, 2, 4): no row
    pays for drafting context it would drop in the first round."""
    target, drafter = pair
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=4, max_model_len=96,
                                                        max_budget=32))
    policy = engine.policy
    assert policy is not None
    for choice in policy.choices:  # alone, trees pay (tau 3 at cost 1) ...
        for _ in range(AR_MIN_SAMPLES):
            policy.observe(1, choice, 1.0, choice, [[0, 1, 2]])
    for choice in (0, *policy.choices):  # ... at batch bucket 4 ar's round is 10x cheaper
        policy.measure(4, choice, 1.0 if choice == 0 else 10.0)
    started: list[str] = []  # rows whose drafting context was prefilled
    assert engine.drafting is not None
    start = engine.drafting.start

    def record_start(slot: int, request_id: str, features: torch.Tensor) -> None:
        started.append(request_id)
        start(slot, request_id, features)

    engine.drafting.start = record_start  # type: ignore[method-assign]
    prompt = [5, 6, 7, 8, 9]
    for i in range(3):
        engine.add_request(f"auto{i}", GenerationRequest(prompt, 8, spec=SpecParams("auto"),
                                                         ignore_eos=True))
    results = engine.step()
    assert {request_id for request_id, _ in results} == {"auto0", "auto1", "auto2"}
    assert started == []
    assert all(not row.drafting and row.stats.mode == "ar" for row in engine.running.values())


def test_a_stalled_round_does_not_move_a_traffic_cost() -> None:
    """Costs are medians: a new shape's first round (one-time costs) or a round that
    waited for the host's other work counts as one sample among the latest few."""
    policy = BudgetPolicy(depth=7, max_budget=16)
    for seconds in (4.0, 1.0, 1.0, 1.0):
        policy.observe(2, 7, seconds, 7, [[0]])
    assert policy.throughput(2, 7) == pytest.approx(1.0)  # not 1 / 1.75, the mean
    for _ in range(COST_WINDOW):  # the window follows the traffic: the round got slower
        policy.observe(2, 7, 2.0, 7, [[0]])
    assert policy.throughput(2, 7) == pytest.approx(0.5)


def test_measured_rounds_attend_to_the_rows_mean_context(pair, monkeypatch) -> None:
    """The scratch rows of a measurement run at the admitted rows' mean context over their
    generation (prompt + max_tokens / 2), not at an empty one: a tree's verify reads its
    context once per node, so an empty context would make trees look cheap next to ar."""
    target, drafter = pair
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=2, max_model_len=160,
                                                        max_budget=32, measure_policy=True))
    from ddtree.engine import core
    from ddtree.engine.state import COMMITTED

    seen: list[int] = []  # the scratch row's committed length as each draft half starts
    draft_into = core.draft_into

    def record(state, drafting, buffers):
        if bool((buffers.rows == state.scratch).all()):  # a measurement's scratch round
            seen.append(int(state.ints[state.scratch, COMMITTED]))
        return draft_into(state, drafting, buffers)

    monkeypatch.setattr(core, "draft_into", record)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7]]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"auto{i}", GenerationRequest(prompt, 40, spec=SpecParams("auto"),
                                                         ignore_eos=True))
    engine.step()
    assert engine.policy is not None and engine.policy.is_measured(2)
    context = (7 + 20 + 3 + 20) // 2
    assert seen and set(seen) == {context}, seen


def test_the_snapshot_says_what_the_policy_believes() -> None:
    policy = BudgetPolicy(depth=15, max_budget=32)
    policy.measure(1, 0, 0.001)
    cost = {15: 0.002, 16: 0.0021, 32: 0.0022}
    tau = {15: 2.0, 16: 3.0, 32: 3.0}
    feed(policy, 1, cost, tau, 3 * MIN_SAMPLES)
    snapshot = policy.snapshot()
    row = snapshot["batches"]["1"]  # type: ignore[index]
    assert row["choices"]["0"]["measured_ms"] == 1.0 and row["choices"]["0"]["traffic_rounds"] == 0
    assert row["choices"]["16"] == {"measured_ms": None, "traffic_ms": 2.1,
                                    "traffic_rounds": MIN_SAMPLES, "tokens_per_s": 1428.6}
    assert row["prefers_ar"] is False  # 1000 tok/s per row vs 1428.6 for the best tree
    assert snapshot["tau"]["32"] == {"tau": 3.0, "rounds": 2 * MIN_SAMPLES}  # type: ignore[index]
    assert snapshot["round"] == 3 * MIN_SAMPLES


def test_a_pipelined_round_costs_the_time_since_the_previous_round_ended() -> None:
    """Round k+1 is launched (t=1.1) while round k (launched at 0, seen done at 2.0) still
    runs and is seen done at 3.0: it cost 1.0 s of throughput, not the 1.9 s since its
    launch; a round launched after an idle host (t=5) costs the time since its launch."""
    assert round_cost(0.0, 2.0, 0.0) == 2.0
    assert round_cost(1.1, 3.0, 2.0) == pytest.approx(1.0)
    assert round_cost(5.0, 5.5, 3.0) == pytest.approx(0.5)


def test_a_slow_chain_bounds_the_untimed_trees_and_sends_auto_to_ar() -> None:
    """Behind a remote drafter only ar is measured: at a new batch size every tree size
    would be timed in traffic first. A tree costs no less than a smaller one, so once the
    chain's rounds cost more than the best acceptance can pay for, ar is chosen without
    timing the larger trees (through `ddtree serve` at c8 that exploring took ~10% of a
    40-request run, lease 11 call 36)."""
    policy = BudgetPolicy(depth=15, max_budget=64)
    tau = {15: 2.3, 16: 2.7, 32: 3.2, 63: 3.6}
    policy.measure(1, 0, 1.0)
    feed(policy, 1, {15: 1.4, 16: 1.4, 32: 1.5, 63: 1.7}, tau, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    assert not policy.prefers_ar(1)  # trees win at batch 1 ...
    policy.measure(8, 0, 1.0)  # ar measured at batch 8; no tree timed there yet
    assert not policy.prefers_ar(8)  # ... so batch 8 is explored
    picks = feed(policy, 8, {15: 8.0}, tau, MIN_SAMPLES)
    assert picks == [15] * MIN_SAMPLES  # the chain, the smallest, is timed first
    # best bound: 3.6 / 8.0 = 0.45 per row against ar's 1.0: ar, the trees untimed
    assert policy.prefers_ar(8)
    # A cheap chain leaves room for the trees: they are timed before any verdict.
    cheap = BudgetPolicy(depth=15, max_budget=64)
    cheap.measure(1, 0, 1.0)
    feed(cheap, 1, {15: 1.4, 16: 1.4, 32: 1.5, 63: 1.7}, tau, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    cheap.measure(8, 0, 1.0)
    feed(cheap, 8, {15: 2.5}, tau, MIN_SAMPLES)
    assert not cheap.prefers_ar(8)  # 3.6 / 2.5 = 1.44 per row might beat ar
    assert cheap.choose(8) == 16  # so the next size is timed


def test_a_larger_batch_follows_a_smaller_one_that_prefers_ar() -> None:
    """A tree's gain over ar only shrinks as the batch grows: a batch bucket where no tree
    was timed yet starts as ar when a smaller bucket prefers ar (through `ddtree serve`
    auto at c8 after c1 otherwise explored every tree size behind the hop first, lease 11
    call 38), and explores when the smaller buckets prefer trees."""
    tau = {15: 2.3, 16: 2.7, 32: 3.2, 63: 3.6}
    slow = BudgetPolicy(depth=15, max_budget=64)
    slow.measure(1, 0, 1.0)
    feed(slow, 1, {15: 4.0, 16: 4.0, 32: 4.2, 63: 4.5}, tau, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    assert slow.prefers_ar(1)  # 3.6 / 4.5 per row against 1 / 1.0
    assert slow.prefers_ar(8) and slow.prefers_ar(64)  # nothing timed there: as batch 1
    fast = BudgetPolicy(depth=15, max_budget=64)
    fast.measure(1, 0, 1.0)
    feed(fast, 1, {15: 1.4, 16: 1.4, 32: 1.5, 63: 1.7}, tau, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    assert not fast.prefers_ar(1) and not fast.prefers_ar(8)  # batch 8 is explored
    assert fast.choose(8) == 15


def test_ar_timed_in_traffic_judges_the_trees_as_traffic_does() -> None:
    """An ar round replayed on scratch rows misses the host's work per round, which a tree
    round timed in traffic carries (lease 13 call 49, the demo pair colocated behind the
    gateway at batch 8: ar rounds ~1.48 ms in traffic against 1.11 replayed). Judged
    against the replay, tree@16 (tau ~3.1, 3.5 ms) is 1.0x ar and auto served ar (5,337
    tok/s); judged against ar's own traffic it is 1.27x, and tree@16 served 6,388 tok/s
    against ar's 5,393 in that run (inside today's margin at 8 rows: ar; a slower ar in
    traffic, 1.7 ms, puts the tree past it)."""
    policy = BudgetPolicy(depth=15, max_budget=16)
    policy.measure(1, 0, 1.0)
    feed(policy, 1, {15: 1.4, 16: 1.5}, {15: 2.3, 16: 3.14}, 2 * MIN_SAMPLES + AR_MIN_SAMPLES)
    for choice, cost in {0: 1.11, 15: 3.3, 16: 3.5}.items():
        policy.measure(8, choice, cost)
    assert policy.prefers_ar(8)  # 3 / 3.5 per row against 1 / 1.11
    for _ in range(MIN_SAMPLES):
        policy.observe(8, 0, 1.48, 0, [])  # ar rounds of any rows at batch 8
    assert policy.prefers_ar(8)  # 3 / 3.5 against 1 / 1.48: 1.27x, inside tree_margin(8)
    assert policy.snapshot()["batches"]["8"]["choices"]["0"]["traffic_rounds"] == MIN_SAMPLES  # type: ignore[index]
    for _ in range(COST_WINDOW):
        policy.observe(8, 0, 1.7, 0, [])
    assert not policy.prefers_ar(8)  # 3 / 3.5 against 1 / 1.7: 1.46x


def test_the_engine_times_every_round_in_traffic_for_the_policy(pair) -> None:
    """A round's cost is its shape's, whoever's rows ran it: rounds of `ar` requests give
    the policy ar's traffic cost at their batch bucket, rounds of a `tree` request their
    node bucket's; acceptance comes from auto rows only."""
    target, drafter = pair
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=2, max_model_len=96,
                                                        max_budget=32))
    for i in range(2):
        engine.add_request(f"ar{i}", GenerationRequest([5, 6, 7 + i], 12,
                                                       spec=SpecParams("ar"), ignore_eos=True))
    while engine.has_work:
        engine.step()
    assert engine.policy is not None
    choices = engine.policy.snapshot()["batches"]["2"]["choices"]  # type: ignore[index]
    assert choices["0"]["traffic_rounds"] >= 10 and choices["0"]["measured_ms"] is None
    assert all(choices[str(c)]["traffic_rounds"] == 0 for c in engine.policy.choices)
    engine.add_request("tree", GenerationRequest([5, 6, 9], 12, spec=SpecParams("tree", 16),
                                                 ignore_eos=True))
    while engine.has_work:
        engine.step()
    snapshot = engine.policy.snapshot()
    assert snapshot["batches"]["1"]["choices"]["16"]["traffic_rounds"] > 0  # type: ignore[index]
    assert snapshot["tau"] == {}  # no auto row drafted
