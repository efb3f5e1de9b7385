"""Reading collectives out of optimized HLO text: groups (listed and iota form), the mesh axes they span, the
bytes per device, the runs per call inside counted loops, and libtpu's Megascale transfers between slices. The
HLO lines are in the form libtpu and XLA print them (tests/planner/test_plan_targets.py reads real compiled
programs)."""

from __future__ import annotations

import pytest

from mle_jax.planner import hlo_collectives as hc
from mle_jax.planner.counting import out_of_memory_figures

HLO = """HloModule jit_ppo_update, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%body (p: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p = (s32[], f32[64]) parameter(0)
  %g = f32[64]{0} get-tuple-element(%p), index=1
  %all-reduce.7 = f32[64]{0:T(128)} all-reduce(%g), channel_id=3, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=%add
  %send.1 = (f32[1,1,128]{2,1,0:T(1,128)}, u32[], token[]) send(%g, %t), channel_id=8, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_reduce_operation="SUM",_xla_megascale_transfer_type="ALL_REDUCE"}
  ROOT %t2 = (s32[], f32[64]) tuple(%i, %all-reduce.7)
}

%cond (p: (s32[], f32[64])) -> pred[] {
  %p = (s32[], f32[64]) parameter(0)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: bf16[4,64]) -> bf16[16,64] {
  %a = bf16[4,64]{1,0} parameter(0)
  %all-gather.1 = bf16[16,64]{1,0} all-gather(%a), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %w = (s32[], f32[64]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"16"}}
  ROOT %r = bf16[16,64]{1,0} copy(%all-gather.1)
}
"""  # noqa: E501 (HLO lines as the compilers print them)


def test_collectives_groups_axes_bytes_and_runs():
    found, unknown = hc.collectives(HLO, (2, 4, 1), ("data", "fsdp", "tensor"))
    assert unknown == 0
    by_op = {c.op: c for c in found}
    gather = by_op["all-gather"]
    assert gather.axes == ("fsdp",) and gather.bytes_per_device == 16 * 64 * 2 and gather.runs_per_call == 1
    reduce = by_op["all-reduce"]  # iota groups: [[0,4],[1,5],[2,6],[3,7]], across the data axis
    assert reduce.groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and reduce.axes == ("data",)
    assert reduce.bytes_per_device == 64 * 4 and reduce.runs_per_call == 16
    dcn = by_op["dcn all-reduce (sum)"]  # libtpu's Megascale send: its operand, 16 times in the loop
    assert dcn.bytes_per_device == 128 * 4 and dcn.runs_per_call == 16
    # two slices of 4 devices: the data-axis all-reduce and the Megascale send cross, fsdp's gather does not
    crossing = hc.crossing(found, [0, 0, 0, 0, 1, 1, 1, 1])
    assert sorted(c.op for c in crossing) == ["all-reduce", "dcn all-reduce (sum)"]
    s = hc.summary(crossing)
    assert s["gib_per_device_per_call"] == pytest.approx(16 * (64 * 4 + 128 * 4) / 1024**3)
    assert set(s["by_op_and_axes"]) == {"all-reduce over data", "dcn all-reduce (sum) over slices"}


def test_a_loop_without_known_trip_count_counts_once():
    found, unknown = hc.collectives(HLO.replace(', backend_config={"known_trip_count":{"n":"16"}}', ""), (2, 4, 1),
                                    ("data", "fsdp", "tensor"))  # fmt: skip
    assert unknown == 1 and {c.runs_per_call for c in found} == {1}


def test_a_loop_bound_by_a_constant_counts_its_trips():
    """libtpu's scheduled HLO carries no known_trip_count: the condition's `i < 16` gives it."""
    hlo = HLO.replace(', backend_config={"known_trip_count":{"n":"16"}}', "").replace(
        "  ROOT %lt = pred[] compare(%i, %n), direction=LT",
        "  %c = s32[]{:T(128)} constant(16)\n  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT",
    )
    found, unknown = hc.collectives(hlo, (2, 4, 1), ("data", "fsdp", "tensor"))
    assert unknown == 0 and {c.op: c.runs_per_call for c in found}["dcn all-reduce (sum)"] == 16


def test_libtpu_out_of_memory_message_becomes_figures():
    message = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (32.14G) "
        "exceeds available HBM (30.75G).\nmore detail"
    )
    out = out_of_memory_figures(message)
    assert out["temporaries_gib"] == 32.14 and out["available_hbm_gib"] == 30.75
    assert out["compile_error"].startswith("RESOURCE_EXHAUSTED") and "\n" not in out["compile_error"]
