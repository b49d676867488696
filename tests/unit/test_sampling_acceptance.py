"""ddtree.sampling and ddtree.acceptance: parameter validation, temperature / top-k / top-p,
the greedy walk on hand-made trees, and losslessness of the sampled walk.

Losslessness is checked with chi-square tests on a toy target: a Markov chain over V = 6
tokens (a node's target distribution depends on its own token). Many independent walks run
at once in the batch dimension over random draft trees; the first committed token after the
root, and the (first, second) pair, must follow the target. Biased rules (always take the
first child, forget the renormalisation, the min(1, p/q) draft ratio) run through the same
check and must FAIL it: the check has power.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from ddtree.acceptance import WalkResult, walk
from ddtree.errors import InvalidArgumentError
from ddtree.sampling import RowSampling, SamplingParams, counter_uniform, target_probs
from ddtree.tree import DraftTree, depths_from_parents

VOCAB = 6
NUM_TRIALS = 60_000
MIN_P_VALUE = 1e-3

# ---------------------------------------------------------------------------- params


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=-0.1), SamplingParams(temperature=math.nan),
    SamplingParams(temperature=math.inf), SamplingParams(top_k=-1), SamplingParams(top_k=2.5),
    SamplingParams(top_p=0.0), SamplingParams(top_p=1.5), SamplingParams(top_p=math.nan),
    SamplingParams(top_p=-0.2), SamplingParams(seed=2**64), SamplingParams(seed="7"),
])
def test_sampling_params_reject_out_of_range_values(params: SamplingParams) -> None:
    with pytest.raises(InvalidArgumentError):
        params.validate()


def test_sampling_params_defaults_are_greedy_and_valid() -> None:
    SamplingParams().validate()
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=-3).validate()
    assert SamplingParams().is_greedy
    assert not SamplingParams(temperature=1e-4).is_greedy


# ---------------------------------------------------------------------------- target_probs


def probs_of(values: list[float], **kwargs: float) -> torch.Tensor:
    """target_probs of log(values) as a (V,) tensor, temperature 1 unless given."""
    logits = torch.tensor(values).log()[None, None]
    return target_probs(logits, SamplingParams(**{"temperature": 1.0, **kwargs}))[0, 0]


def test_target_probs_greedy_is_one_hot_on_the_argmax() -> None:
    logits = torch.tensor([[[0.1, 3.0, 3.0, -1.0], [2.0, 0.0, 1.0, 1.9]]])
    probs = target_probs(logits, SamplingParams())
    assert torch.equal(probs, torch.tensor([[[0.0, 1, 0, 0], [1, 0, 0, 0]]]))


def test_target_probs_temperature_scales_the_logits() -> None:
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0)).double()
    probs = target_probs(logits, SamplingParams(temperature=0.5))
    assert probs.dtype == torch.float32 and probs.shape == (2, 3, 7)
    torch.testing.assert_close(probs, torch.softmax(logits * 2, -1).float())


def test_target_probs_top_k() -> None:
    values = [0.1, 0.4, 0.2, 0.3]
    torch.testing.assert_close(probs_of(values, top_k=2), torch.tensor([0, 4 / 7, 0, 3 / 7]))
    torch.testing.assert_close(probs_of(values, top_k=1), torch.tensor([0.0, 1, 0, 0]))
    torch.testing.assert_close(probs_of(values, top_k=4), torch.tensor(values))
    torch.testing.assert_close(probs_of(values, top_k=99), torch.tensor(values))
    # Tokens tied with the k-th largest stay: top-2 of (0.4, 0.3, 0.3) keeps three.
    torch.testing.assert_close(probs_of([0.4, 0.3, 0.3], top_k=2), torch.tensor([0.4, 0.3, 0.3]))


def test_target_probs_top_p() -> None:
    values = [0.15, 0.5, 0.05, 0.3]
    torch.testing.assert_close(probs_of(values, top_p=0.45), torch.tensor([0.0, 1, 0, 0]))
    torch.testing.assert_close(probs_of(values, top_p=0.55), torch.tensor([0, 0.5, 0, 0.3]) / 0.8)
    kept = torch.tensor([0.15, 0.5, 0, 0.3])
    torch.testing.assert_close(probs_of(values, top_p=0.9), kept / 0.95)
    torch.testing.assert_close(probs_of(values, top_p=1.0), torch.tensor(values))
    # A tiny top_p still keeps the most probable token.
    torch.testing.assert_close(probs_of(values, top_p=1e-9), torch.tensor([0.0, 1, 0, 0]))


def test_target_probs_applies_top_k_before_top_p_to_every_row() -> None:
    values = [0.15, 0.5, 0.05, 0.3]
    expected = torch.tensor([0, 0.5, 0, 0.3]) / 0.8  # top-2, then top_p 0.9 keeps both
    logits = torch.tensor(values).log().expand(2, 3, 4)
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.9))
    torch.testing.assert_close(probs, expected.expand(2, 3, 4))


def test_target_probs_keeps_ties_at_the_top_p_cutoff() -> None:
    # 0.4 reaches top_p 0.35 alone, but its twin has the same probability: both stay.
    torch.testing.assert_close(probs_of([0.4, 0.4, 0.2], top_p=0.35), torch.tensor([0.5, 0.5, 0]))


def reference_probs(logits: list[float], params: SamplingParams) -> list[float]:
    """target_probs for one row, in plain Python: the spec written out."""
    scaled = [x / params.temperature for x in logits]
    if 0 < params.top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[params.top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    peak = max(scaled)
    weights = [math.exp(x - peak) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    if params.top_p < 1:
        ordered, mass, cutoff = sorted(probs, reverse=True), 0.0, 0.0
        for p in ordered:
            if mass >= params.top_p:
                break
            cutoff, mass = p, mass + p
        probs = [p if p >= cutoff else 0.0 for p in probs]
        probs = [p / sum(probs) for p in probs]
    return probs


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0), SamplingParams(temperature=0.3, top_k=5),
    SamplingParams(temperature=1.7, top_p=0.6), SamplingParams(temperature=1.0, top_p=0.2),
    SamplingParams(temperature=0.9, top_k=7, top_p=0.8),
    SamplingParams(temperature=1.2, top_k=3, top_p=0.99),
])
def test_target_probs_equals_the_plain_python_spec(params: SamplingParams) -> None:
    logits = torch.randn(3, 4, 20, generator=torch.Generator().manual_seed(2)) * 2
    probs = target_probs(logits, params)
    expected = [[reference_probs(row, params) for row in rows] for rows in logits.tolist()]
    torch.testing.assert_close(probs, torch.tensor(expected), atol=1e-6, rtol=1e-5)


def test_counter_uniforms_depend_only_on_seed_counter_and_stream() -> None:
    seed, counter = torch.tensor([42, 42, 43, -5]), torch.tensor([7, 7, 7, 7])
    draws = counter_uniform(seed, counter, 0, 1000)  # (4, 1000)
    assert torch.equal(draws[0], draws[1])  # the same seed and counter, another batch row
    assert not torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[3])
    assert not torch.equal(draws[0], counter_uniform(seed, counter + 1, 0, 1000)[0])
    assert not torch.equal(draws[0], counter_uniform(seed, counter, 1, 1000)[0])
    assert torch.equal(draws[0, :10], counter_uniform(seed[:1], counter[:1], 0, 10)[0])
    assert ((draws > 0) & (draws < 1)).all()
    # Uniform enough for the chi-square checks: 20 equal bins over 40,000 draws.
    many = counter_uniform(torch.arange(40), torch.zeros(40, dtype=torch.long), 0, 1000)
    counts = torch.histc(many, bins=20, min=0.0, max=1.0)
    assert chisquare(counts.numpy()).pvalue > MIN_P_VALUE


def rows_of(params: SamplingParams, batch: int, seed: int = 0) -> RowSampling:
    """The same parameters for `batch` rows, each row with its own seed (independent
    draws: trials in the batch dimension must not share their random numbers)."""
    return RowSampling.of(params, batch, "cpu", seed + torch.arange(batch))


def walk_with(tree: DraftTree, logits: torch.Tensor, params: SamplingParams, seed: int = 0,
              first_child_only: bool = False, max_depth: int | None = None,
              counter: int = 0) -> WalkResult:
    """`walk` with one SamplingParams for every row, as the old single-params API."""
    batch, num_rows = tree.tokens.shape
    return walk(tree, logits, rows_of(params, batch, seed),
                torch.full((batch,), counter, dtype=torch.long),
                torch.full((batch,), first_child_only), num_rows - 1 if max_depth is None
                else max_depth)


# ---------------------------------------------------------------------------- greedy walk

# root(0) -> 1:'5', 2:'6', 3:'7';  2 -> 4:'8', 5:'9';  5 -> 6:'10';  1 -> 7:'11'
HAND_TOKENS = [4, 5, 6, 7, 8, 9, 10, 11]
HAND_PARENTS = [-1, 0, 0, 0, 2, 2, 5, 1]


def hand_tree(tokens: list[int] = HAND_TOKENS, parents: list[int] = HAND_PARENTS) -> DraftTree:
    parent_tensor = torch.tensor([parents])
    return DraftTree(torch.tensor([tokens]), parent_tensor, depths_from_parents(parent_tensor))


def greedy_logits(choices: list[int], vocab: int = 16) -> torch.Tensor:
    """(1, 1+N, V) logits whose argmax at node i is choices[i]."""
    logits = torch.zeros(1, len(choices), vocab)
    logits[0, torch.arange(len(choices)), torch.tensor(choices)] = 1.0
    return logits


def greedy_walk(choices: list[int], tree: DraftTree | None = None, **kwargs: object) -> WalkResult:
    tree = tree or hand_tree()
    return walk_with(tree, greedy_logits(choices), SamplingParams(), **kwargs)  # type: ignore[arg-type]


def assert_walk(result: WalkResult, path: list[int], next_token: int) -> None:
    width = result.path.shape[1]
    assert result.path.tolist() == [path + [0] * (width - len(path))]
    assert result.acceptance_length.tolist() == [len(path)]
    assert result.next_token.tolist() == [next_token]
    assert result.acceptance_length.dtype == torch.int64 and result.next_token.dtype == torch.int64


def test_greedy_walk_accepts_nothing_when_no_child_matches() -> None:
    assert_walk(greedy_walk([3, 0, 0, 0, 0, 0, 0, 0]), [0], 3)


def test_greedy_walk_follows_the_deepest_matching_path() -> None:
    assert_walk(greedy_walk([6, 0, 9, 0, 0, 10, 2, 0]), [0, 2, 5, 6], 2)


def test_greedy_walk_stops_inside_a_middle_branch() -> None:
    assert_walk(greedy_walk([6, 0, 8, 0, 13, 10, 2, 0]), [0, 2, 4], 13)
    assert_walk(greedy_walk([6, 0, 9, 0, 0, 12, 2, 0]), [0, 2, 5], 12)


def test_greedy_walk_accepts_a_whole_chain() -> None:
    chain = hand_tree([1, 2, 3, 4], [-1, 0, 1, 2])
    assert_walk(greedy_walk([2, 3, 4, 9], chain), [0, 1, 2, 3], 9)


def test_first_child_only_ignores_a_matching_second_child() -> None:
    choices = [6, 11, 9, 0, 0, 10, 2, 0]
    assert_walk(greedy_walk(choices), [0, 2, 5, 6], 2)
    assert_walk(greedy_walk(choices, first_child_only=True), [0], 6)
    # Along rank-0 children it behaves like the linear rule: 0 -> 1 -> 7.
    assert_walk(greedy_walk([5, 11, 0, 0, 0, 0, 0, 3], first_child_only=True), [0, 1, 7], 3)


def test_greedy_walk_respects_max_depth_and_takes_the_first_duplicate() -> None:
    result = greedy_walk([6, 0, 9, 0, 0, 10, 2, 0], max_depth=2)
    assert result.path.shape == (1, 3)
    assert_walk(result, [0, 2, 5], 10)
    assert_walk(greedy_walk([6, 0, 9, 0, 0, 10, 2, 0], max_depth=0), [0], 6)
    twins = hand_tree([0, 3, 3, 4], [-1, 0, 0, 2])
    assert_walk(greedy_walk([3, 7, 4, 1], twins), [0, 1], 7)


def test_greedy_walk_rows_are_independent() -> None:
    tree = hand_tree()
    batched = DraftTree(*(t.repeat(2, 1) for t in (tree.tokens, tree.parents, tree.depth)))
    logits = torch.cat([greedy_logits([6, 0, 9, 0, 0, 10, 2, 0]), greedy_logits([3] * 8)])
    result = walk_with(batched, logits, SamplingParams())
    assert result.path.tolist() == [[0, 2, 5, 6, 0, 0, 0, 0], [0] * 8]
    assert result.acceptance_length.tolist() == [4, 1]
    assert result.next_token.tolist() == [2, 3]


def test_same_seed_gives_the_same_sampled_walk() -> None:
    tree = hand_tree()
    batched = DraftTree(*(t.repeat(500, 1) for t in (tree.tokens, tree.parents, tree.depth)))
    logits = torch.randn(500, 8, 16, generator=torch.Generator().manual_seed(1)) * 0.3
    logits[:, torch.arange(8), torch.tensor([6, 0, 9, 0, 0, 10, 2, 0])] += 3  # accept often
    params = SamplingParams(temperature=1.0, seed=7)
    runs = [walk_with(batched, logits, params, seed) for seed in (7, 7, 8)]
    for name in ("path", "acceptance_length", "next_token"):
        assert torch.equal(getattr(runs[0], name), getattr(runs[1], name))
    assert not torch.equal(runs[0].next_token, runs[2].next_token)
    assert (runs[0].acceptance_length > 1).any() and (runs[0].acceptance_length == 1).any()


# ---------------------------------------------------------------------------- losslessness

TOPOLOGIES = {
    "star": [-1, 0, 0, 0],
    "wide_star": [-1, 0, 0, 0, 0, 0],
    "chain": [-1, 0, 1, 2],
    "tree": [-1, 0, 0, 1, 1, 2, 3, 4],
}


def target_table(gen: torch.Generator) -> torch.Tensor:
    """(V, V) the toy target's logits: row a = logits of the token that follows token a."""
    return torch.randn(VOCAB, VOCAB, generator=gen)


def random_tree(parents: list[int], roots: torch.Tensor, table: torch.Tensor,
                gen: torch.Generator, siblings: str = "distinct") -> DraftTree:
    """One draft tree per trial with the given topology, tokens drawn node by node like a
    good drafter (the target's logits plus a little noise; a good drafter also gives the
    checks power against biases that only show on deep paths). siblings: "distinct"
    (a Gumbel-top-k ranking per parent), "draws" (independent draws: repeats happen) or
    "twins" (the second child always repeats the first child's token)."""
    num_trials, num_rows = roots.shape[0], len(parents)
    tokens = torch.zeros(num_trials, num_rows, dtype=torch.long)
    tokens[:, 0] = roots
    rankings: dict[int, torch.Tensor] = {}
    for node in range(1, num_rows):
        parent = parents[node]
        if parent not in rankings:
            draft = table[tokens[:, parent]] + torch.randn(num_trials, VOCAB, generator=gen) * 0.5
            if siblings == "draws":
                rankings[parent] = torch.multinomial(
                    torch.softmax(draft, -1), VOCAB, replacement=True, generator=gen
                )  # (T, V)
            else:
                gumbel = -torch.empty(num_trials, VOCAB).exponential_(generator=gen).log()
                rankings[parent] = (draft + gumbel).argsort(dim=-1, descending=True)
        sibling = sum(1 for j in range(1, node) if parents[j] == parent)
        if siblings == "twins" and sibling > 0:
            sibling -= 1
        tokens[:, node] = rankings[parent][:, sibling]
    parent_tensor = torch.tensor(parents).expand(num_trials, -1).contiguous()
    return DraftTree(tokens, parent_tensor, depths_from_parents(parent_tensor))


def first_committed(tree: DraftTree, result: WalkResult, position: int) -> torch.Tensor:
    """(T,) the committed token at `position` (1 = first after the root), -1 when the round
    committed fewer tokens."""
    length = result.acceptance_length
    path = torch.nn.functional.pad(result.path, (0, position + 1))
    on_path = tree.tokens.gather(1, path[:, position:position + 1])[:, 0]
    unknown = torch.full_like(on_path, -1)
    return torch.where(position < length, on_path,
                       torch.where(position == length, result.next_token, unknown))


def committed_pairs(topology: str, params: SamplingParams, seed: int, **walk_args: object
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs NUM_TRIALS independent decodes from root token 0 for two committed tokens (a
    second round when the first accepted nothing). Returns first (T,), second (T,), the
    target table."""
    gen = torch.Generator().manual_seed(seed)
    table = target_table(gen)
    name, _, siblings = topology.partition(":")
    parents = TOPOLOGIES[name]
    roots = torch.zeros(NUM_TRIALS, dtype=torch.long)
    tree = random_tree(parents, roots, table, gen, siblings or "distinct")
    result = walk_with(tree, table[tree.tokens], params, seed, **walk_args)  # type: ignore[arg-type]
    first, second = first_committed(tree, result, 1), first_committed(tree, result, 2)
    next_tree = random_tree(parents, first, table, gen, siblings or "distinct")  # round 2
    next_result = walk_with(next_tree, table[next_tree.tokens], params, seed,  # type: ignore[arg-type]
                            counter=1, **walk_args)
    second = torch.where(second >= 0, second, first_committed(next_tree, next_result, 1))
    return first, second, table


def chi_square_p_value(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of samples (T,) in [0, C) against probs (C,); cells of expected count < 5
    are pooled so the chi-square approximation holds."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() / probs.double().sum() * samples.numel()
    assert counts[expected == 0].sum() == 0, "a token of target probability 0 was committed"
    small = expected < 5
    counts = torch.cat([counts[~small], counts[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    if keep.sum() < 2:
        return 1.0  # a single possible outcome, and the assert above saw only it
    return float(chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue)


def assert_lossless(first: torch.Tensor, second: torch.Tensor, table: torch.Tensor,
                    params: SamplingParams) -> None:
    probs = target_probs(table[None], params)[0]  # (V, V): row a = p(next | a)
    assert chi_square_p_value(first, probs[0]) > MIN_P_VALUE
    pair_probs = probs[0][:, None] * probs  # (V, V): p(a | 0) p(b | a)
    assert chi_square_p_value(first * VOCAB + second, pair_probs.flatten()) > MIN_P_VALUE


LOSSLESS_CASES = [  # ("topology[:siblings]", params, walk arguments)
    ("star", SamplingParams(temperature=1.0), {}),
    ("wide_star", SamplingParams(temperature=1.0), {}),
    ("chain", SamplingParams(temperature=1.0), {}),
    ("tree", SamplingParams(temperature=1.0), {}),
    ("star:draws", SamplingParams(temperature=1.0), {}),
    ("tree:draws", SamplingParams(temperature=0.8), {}),
    ("wide_star:twins", SamplingParams(temperature=1.0), {}),
    ("tree:twins", SamplingParams(temperature=1.0), {}),
    ("tree", SamplingParams(temperature=1.0), {"first_child_only": True}),
    ("chain", SamplingParams(temperature=1.0), {"max_depth": 1}),
    ("tree", SamplingParams(temperature=0.6, top_k=3), {}),
    ("wide_star", SamplingParams(temperature=1.4, top_p=0.75), {}),
    ("tree", SamplingParams(temperature=1.3, top_k=4, top_p=0.85), {}),
    ("chain", SamplingParams(temperature=0.7, top_k=2), {}),
]


@pytest.mark.parametrize("case_index", range(len(LOSSLESS_CASES)))
def test_sampled_walk_commits_exact_target_samples(case_index: int) -> None:
    topology, params, walk_args = LOSSLESS_CASES[case_index]
    first, second, table = committed_pairs(topology, params, seed=1000 + case_index, **walk_args)
    assert (first >= 0).all() and (second >= 0).all()
    # Not vacuous: the root's distribution is spread out...
    assert (target_probs(table[:1][None], params) > 0.05).sum() >= 2
    assert_lossless(first, second, table, params)


def test_sampled_walk_often_accepts_deep_paths() -> None:
    """...and the drafts are good enough that the walk goes deep, so the second committed
    token regularly comes from an accepted child rather than from the bonus."""
    gen = torch.Generator().manual_seed(5)
    table = target_table(gen)
    tree = random_tree(TOPOLOGIES["tree"], torch.zeros(NUM_TRIALS, dtype=torch.long), table, gen)
    params = SamplingParams(temperature=1.0)
    result = walk_with(tree, table[tree.tokens], params, 6)
    share = torch.bincount(result.acceptance_length, minlength=5).float() / NUM_TRIALS
    assert share[1] > 0.1 and share[2] > 0.1 and share[3] > 0.1, share


# ---------------------------------------------------------------------------- power


def star_first_tokens(
    probs: torch.Tensor, children: torch.Tensor, draft: torch.Tensor, rule: str,
    gen: torch.Generator,
) -> torch.Tensor:
    """First committed token of a sequential rule at the root of a star, for the power
    check: probs (V,) target, children (T, k) draft tokens tried in order, draft (T, V) the
    draft marginals they are the top-k of. Rules: "exact" (the tree rule), "first_child"
    (always accept it), "no_renormalisation" (accept with p(c)), "draft_ratio"
    (min(1, p/q)), "keep_rejected" (exact acceptance, bonus from p unmodified)."""
    num_trials = children.shape[0]
    chosen = torch.full((num_trials,), -1)
    rejected_mass = torch.zeros(num_trials)
    for i in range(children.shape[1]):
        p, q = probs[children[:, i]], draft.gather(1, children[:, i:i + 1])[:, 0]
        accept = {
            "first_child": torch.ones_like(p) if i == 0 else torch.zeros_like(p),
            "no_renormalisation": p,
            "draft_ratio": (p / q).clamp(max=1),
        }.get(rule, p / (1 - rejected_mass))
        take = (chosen < 0) & (torch.rand(num_trials, generator=gen) < accept)
        chosen = torch.where(take, children[:, i], chosen)
        rejected_mass = rejected_mass + p
    residual = probs.expand(num_trials, -1).clone()
    if rule != "keep_rejected":
        residual.scatter_(1, children, 0.0)
    bonus = torch.multinomial(residual, 1, generator=gen)[:, 0]
    return torch.where(chosen >= 0, chosen, bonus)


def star_experiment(rule: str) -> float:
    """p-value of the first committed token under `rule` on 3-child stars whose children are
    the top-3 of a (sharper than the target) draft distribution."""
    gen = torch.Generator().manual_seed(77)
    table = target_table(gen)
    probs = torch.softmax(table[0], -1)
    draft = torch.softmax((table[0] + torch.randn(NUM_TRIALS, VOCAB, generator=gen)) / 0.5, -1)
    children = draft.topk(3, dim=-1).indices  # (T, 3)
    if rule == "walk":
        tokens = torch.cat([torch.zeros(NUM_TRIALS, 1, dtype=torch.long), children], dim=1)
        parents = torch.tensor([TOPOLOGIES["star"]]).expand(NUM_TRIALS, -1)
        tree = DraftTree(tokens, parents, depths_from_parents(parents))
        result = walk_with(tree, table[tokens], SamplingParams(temperature=1.0), 123)
        return chi_square_p_value(first_committed(tree, result, 1), probs)
    return chi_square_p_value(star_first_tokens(probs, children, draft, rule, gen), probs)


def test_chi_square_check_passes_the_exact_rule_and_the_walk() -> None:
    assert star_experiment("exact") > MIN_P_VALUE
    assert star_experiment("walk") > MIN_P_VALUE


@pytest.mark.parametrize(
    "rule", ["first_child", "no_renormalisation", "draft_ratio", "keep_rejected"]
)
def test_chi_square_check_rejects_biased_rules(rule: str) -> None:
    assert star_experiment(rule) < MIN_P_VALUE
