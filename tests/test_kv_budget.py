"""epyc.decisions.kv_budget: the need, the grant and its basis, the capacity behind --max-num-seqs, the per-rank row."""

import math

import pytest
from epyc import errors
from epyc.bundle import GIB
from epyc.decisions import kv_budget
from epyc.decisions.kv_budget import Need
from epyc.facts import kv_cache

# data/epyc.json's rules, fixed here: the need x 1.25 at least, half of what is left, a batch of 256 + 25 %
RULES = {
    "memory": {"kv_headroom_factor": 1.25, "kv_default_fraction": 0.5, "kv_prefix_cache_share": 0.25},
    "serve": {"max_num_seqs_cap": 256},
}


def grant(ram, reserve, weight=None, need=None, per_seq=None, where="socket"):
    return kv_budget.grant(RULES, ram, reserve, Need(weight, need, per_seq), where)


# ---- the need


def test_fit_boundary_is_inclusive_and_the_suggestion_is_the_largest_block_that_fits():
    """Mutation survivors of fit(): `required <= ram` (exactly full RAM fits) and the binary search's bounds."""
    lay = {
        "full": 2,
        "sliding": 0,
        "none": 0,
        "bytes_per_token_per_layer": 1024,
        "sliding_window": None,
        "recurrent_state_bytes": 0,
    }
    kv_4096 = kv_cache.kv_bytes_for(lay, 4096, 128, 2048)
    assert kv_4096 == 2 * 32 * 128 * 1024  # 2 layers x 32 pages of 128 tokens x 1 KiB
    weights = 3 * GIB - kv_4096  # weights + KV + 1 GiB reserve == 4 GiB exactly
    exact = kv_budget.fit(weights, lay, 4096, 1, 4.0, 1.0, 128, None, 2048)
    assert exact["fits"] is True and "suggested_max_model_len" not in exact
    one_byte_over = kv_budget.fit(weights + 1, lay, 4096, 1, 4.0, 1.0, 128, None, 2048)
    # one byte too many: 31 pages (3968 tokens) still fit, 32 do not
    assert one_byte_over["fits"] is False and one_byte_over["suggested_max_model_len"] == 3968
    # the model's own limit caps the search, and no block at all gives None with the reason
    assert kv_budget.fit(weights + 1, lay, 4096, 1, 4.0, 1.0, 128, 1024, 2048)["suggested_max_model_len"] == 1024
    nothing = kv_budget.fit(4 * GIB, lay, 4096, 1, 4.0, 1.0, 128, None, 2048)
    assert nothing["suggested_max_model_len"] is None and nothing["action"].startswith("weights alone exceed RAM")
    exactly_full = kv_budget.fit(3 * GIB, lay, 4096, 1, 4.0, 1.0, 128, None, 2048)  # budget 0: no KV at all
    assert exactly_full["action"].startswith("weights alone exceed RAM")
    tight = kv_budget.fit(3 * GIB - 1000, lay, 4096, 1, 4.0, 1.0, 128, None, 2048)
    assert tight["suggested_max_model_len"] is None and tight["action"].startswith("not even 128 tokens")
    assert one_byte_over["action"] == "lower --max-model-len to 3968 (or lower --num-prompts), or use a smaller model"


# ---- the per-rank row


def test_what_a_rank_holds_is_the_estimate_for_one_and_its_row_for_several():
    row = {
        "ranks": 2,
        "weight_gb": 0.6,
        "kv_bytes_per_token": 57344,
        "kv_bytes_per_sequence": 2**28,
        "kv_needed_gb": 0.22,
    }
    est = {
        "weight_gb": 1.11,
        "kv_bytes_per_token": 114688,
        "kv_bytes_per_sequence": 2**29,
        "fit": {"kv_needed_gb": 0.44},
        "tensor_parallel": ["not a row", row],
    }
    assert kv_budget.need_of(est) == Need(1.11, 0.44, 0.5, 2**29, 114688)
    assert kv_budget.need_of(est, 2) == Need(0.6, 0.22, 0.25, 2**28, 57344)
    assert kv_budget.rank_need(est["tensor_parallel"], 2) == kv_budget.need_of(est, 2)
    assert kv_budget.need_of(est, 4) is None and kv_budget.rank_need(None, 2) is None  # no row: vLLM cannot split it
    # no RAM given to estimate_memory: weights and sequences, but no need to hold
    assert kv_budget.need_of({**est, "fit": None}).kv_needed_gb is None
    assert kv_budget.need_of({}) == Need()
    assert kv_budget.need_of({**est, "kv_bytes_per_sequence": 0}).kv_per_sequence_gb is None


# ---- the grant and each basis it names


def test_the_grant_is_half_what_is_left_at_least_the_need_at_most_what_is_left():
    out = grant(8, 2)  # no model need: half of (8 - 2 reserve) = 3
    assert out == kv_budget.Grant(3, "0.5 of socket RAM left after OS reserve and weights (no model need given)")
    # serving, not one prompt: a 0.5 GiB need on 8 GiB gets half of the 4.8 left -> 2 (need x 1.25 = 1 is the floor)
    out = grant(8, 2, 1.2, 0.5)
    assert out.kv_gb == 2 and out.warning is None
    assert out.basis == (
        "0.5 of the socket RAM left after OS reserve and weights (4.8 GiB); at least the need, at most what the "
        "socket has left"
    )
    # a 384 GiB socket with 16 GiB of weights and a 7 GiB need: half of the 366 left = 183, not 9
    assert grant(384, 2, 16, 7).kv_gb == 183
    # a big need on a small socket: the need x headroom wins over the share, capped by what is left
    out = grant(16, 2, 2, 8)
    assert out.kv_gb == 10 and out.basis == "model need 8 GiB x 1.25 headroom (more than the share below)"
    out = grant(16, 2, 2, 11)
    assert out.kv_gb == 12 and out.basis == "all the socket RAM left after OS reserve and weights (12.0 GiB)"
    assert grant(8, 2, 2, 4).kv_gb == 4  # exactly enough: the grant is never below the need


def test_the_kv_grant_is_what_the_largest_batch_can_use():
    """A test model of 4 MB a sequence gets 2 GiB of a 24 GiB machine, 256 sequences of it + 25 % for the prefix
    cache; the need (--num-prompts) still wins when it is larger."""
    out = grant(23.5, 2, 0.01, 0.004, 0.004)
    assert out.kv_gb == 2 and out.basis.startswith("what the largest running batch can use (1.024 GiB) + 25% for")
    out = grant(384, 2, 1.11, 131.25, 0.4375)  # 256 full-length requests asked
    assert out.kv_gb == 165 and out.basis.startswith("model need 131.25 GiB x 1.25 headroom")
    out = grant(16, 2, 2, 11, 1 / 256)  # the need x headroom is past what is left
    assert out.kv_gb == 12 and out.basis.startswith("all the socket RAM left")
    assert grant(384, 2, 1.11, None, 0.4375).kv_gb == 140  # 112 GiB of batch + 25 %, not half the socket (190)


def test_memory_that_cannot_hold_the_need_is_refused_and_a_tiny_one_gets_the_minimum():
    # cannot hold: 8 - 2 - 5 = 1 left for a 4 GiB need -> refused, never a silent under-grant
    with pytest.raises(
        errors.ScriptError, match=r"^socket RAM 8 GiB cannot hold weights 5 GiB \+ KV 4 GiB \+ OS reserve 2 GiB$"
    ):
        grant(8, 2, 5, 4)
    with pytest.raises(errors.ScriptError, match=r"cannot hold weights 0 GiB \+ KV 7 GiB"):  # no weights given
        grant(8, 2, None, 7)
    # 3.95 left for a 3.9 GiB need: vLLM takes whole GiB, so 3 would be granted -- refused too
    with pytest.raises(kv_budget.DoesNotFit, match="cannot hold"):
        grant(7.95, 2, 2, 3.9)
    with pytest.raises(kv_budget.DoesNotFit, match=r"^rank's node RAM 8 GiB cannot hold"):
        grant(8, 2, 5, 4, where="rank's node")
    out = grant(8, 2, 5.5)  # 0.5 GiB left: the 1 GiB minimum, said
    assert out.kv_gb == 1 and out.warning == (
        "only 0.5 GiB left on the socket after weights and OS reserve; KV cache set to the 1 GiB minimum"
    )
    assert grant(64, 2, where="node 3").basis.startswith("0.5 of node 3 RAM left")


@pytest.mark.parametrize("need", [None, 0.3, 1.0, 2.5, 3.9, 4.0, 7.2])
@pytest.mark.parametrize("ram", [6.0, 7.95, 8.0, 12.5, 64.0])
def test_a_grant_is_never_short_of_the_need_nor_past_what_is_left(ram, need):
    """The rule the plan re-checks documents by (short_of) holds for every grant the budget makes."""
    left = ram - 2 - 1.5
    try:
        out = grant(ram, 2, 1.5, need)
    except kv_budget.DoesNotFit:
        assert kv_budget.short_of(math.floor(left), need)
        return
    assert not kv_budget.short_of(out.kv_gb, need) and out.kv_gb <= math.floor(left)


def test_short_of_is_a_grant_below_the_need():
    assert kv_budget.short_of(3, 3.9) and not kv_budget.short_of(4, 3.9) and not kv_budget.short_of(4, 4.0)
    assert not kv_budget.short_of(0, None)  # no need given: nothing to fall short of


# ---- what the grant holds: --max-num-seqs


def test_the_capacity_follows_the_grant_within_the_cap_and_the_step():
    need = Need(kv_bytes_per_token=1024, kv_bytes_per_sequence=2**20)  # 1 MiB a full-length request
    assert kv_budget.capacity(1, need, 256, 2048) == kv_budget.Capacity(2**20, 1024, 256)  # the cap
    assert kv_budget.capacity(1, need, 4096, 2048).max_num_seqs == 1024  # the cache
    assert kv_budget.capacity(1, need, 4096, 512).max_num_seqs == 512  # never above the tokens one step takes
    assert kv_budget.capacity(1, need, 4096).max_num_seqs == 1024
    few = kv_budget.capacity(1, Need(kv_bytes_per_sequence=2 * GIB), 256, 2048)
    assert few == kv_budget.Capacity(None, 0, 1)  # not one full-length request: still one sequence
    assert kv_budget.capacity(190, Need(kv_bytes_per_token=114688), 256, 2048) == kv_budget.Capacity(
        190 * GIB // 114688, None, None
    )  # another length than the estimate's: no request count, no --max-num-seqs from it
