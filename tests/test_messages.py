"""The codec of the messages between the launcher and its rank workers (topoprof/specs/messages.py)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from topoprof.measure.launch import RunResult, as_message, worker_result
from topoprof.specs.messages import (
    CollectiveRow,
    CollectivesJob,
    CollectivesMeta,
    CollectiveStopped,
    DeviceProfileResult,
    Message,
    MessageError,
    NodesJob,
    NodesResult,
    NumericsJob,
    NumericsResult,
    OpTraceJob,
    OpTraceResult,
    OpTracesResult,
    PhasesJob,
    PhaseStarted,
    ProfileJob,
    ProfileProgress,
    Progress,
    RankDone,
    RankError,
    SleepJob,
    SleepStep,
    StepMemory,
    TimedPass,
    TraceFailure,
    TraceVariant,
    TrainingCalibration,
    TrainingJob,
    TrainingResult,
    UserModelJob,
    UserModelRecord,
    UserModelResult,
    ValidationJob,
    ValidationRotations,
    WorkerFailure,
    decode,
    encode,
    phase,
    registered,
)
from topoprof.specs.traced_pass import (
    AttentionChoices,
    KeptByPlace,
    KeptTensor,
    MemorySegment,
    OpSum,
    ParamEntry,
    PassMemory,
    PassTotals,
    PhaseTotals,
    SelectiveCheckpointCost,
    TracedOp,
    TracedPass,
    TraceTarget,
    WrappedBlocks,
)

TRAINING = {"spec": {"vocab": 64, "d_model": 8}, "mode": "ddp_synced", "micro_batch": 2, "steps": 3,
            "warmup_steps": 1, "accum": 4, "bucket_cap_mb": 0.05, "seed": 7, "optimizer": "sgd", "lr": 0.1,
            "amp": "bf16", "threads": 1, "count_comm_hook_calls": True, "numerics_dtype": "float32", "ac": "full",
            "user_model": "model.py:build"}

MM = TracedOp("aten.mm.default", "forward", 64, False, 32, 16, shapes=[[2, 4], [4, 2]], outputs=[16],
              reads=[[1, 16], [2, 16]], writes=[[3, 16]])
MEMORY = PassMemory(48, 0, KeptByPlace(1, 8, [16], 24, [KeptTensor("aten.mm.default", "torch.float32", [2, 2], 16)]),
                    64, 512, 48, 16, 40, 64, 24, 32,
                    [MemorySegment("forward", "block", 0, 48, 32, 0, "aten.mm.default", "aten.mm.default")])
TRACE = TracedPass([MM], PassTotals(PhaseTotals(1, 64, 32, 16)), MEMORY, ready=[[0, 1.0]], ready_flops=[[0, 64]],
                   by_name=[OpSum("aten.mm.default", "forward", 1, 64, 32, 16)], target=TraceTarget("cpu"),
                   spec="model.py:build", shape="2x4", params=[ParamEntry("w", [4, 2], "bfloat16", False, ["v"])],
                   attention=AttentionChoices({"flash": 2}, {"cudnn": "sm80"}),
                   checkpointing=WrappedBlocks("full", "layers", 4, 4, "found"),
                   selective_checkpoint=SelectiveCheckpointCost(2.5, "stated", 5e-6, 2e-6))

# one filled-in example of every message class, each field away from its default
EXAMPLES: list[Message] = [
    UserModelJob("model.py:build", "cuda:0", 2, "/tmp", "fp16", "sgd", {"depth": 2}, {"micro_batch": 4},
                 TraceTarget("cuda", "bf16", capability=(9, 0)), "full", "blocks"),
    OpTraceJob("model.py:build", {"depth": 2}, {"seq_len": 8}, TraceTarget("cuda", "fp16"), "/tmp", "op", "layers",
               [TraceVariant({"depth": 3}, {"micro_batch": 2}, TraceTarget("cuda", "bf16", "cast"), "full", 1, True),
                TraceVariant()]),
    ProfileJob("cuda", True, 30.0),
    CollectivesJob(["all_reduce", "all_gather"], [8, 16], 3, 1, "float16", "max", False, 1, ["intra", "job"]),
    TrainingJob(**TRAINING),
    ValidationJob(**TRAINING, modes=["ddp_no_sync"], interference=False),
    NumericsJob(**{**TRAINING, "mode": "numerics"}, fsdp_modes=["fsdp_full_shard"]),
    NodesJob(),
    PhasesJob([phase("bench", "collectives", CollectivesJob(["all_reduce"], [8], 3, 1, "float32", "avg"))]),
    SleepJob(5, 0.5, 1, 2, "hang"),
    UserModelResult(UserModelRecord("model.py:build", "cpu", [ParamEntry("w", [2, 2])], samples=4,
                                    ready=[[0, 1.0]], passes=[TimedPass(0.1, 0.2, [[0, 1.0]])],
                                    memory=StepMemory("cuda:0", 16, 32, 64, 16, 128),
                                    op_trace=TraceFailure("on meta, boom"))),
    OpTraceResult(TRACE),
    OpTracesResult([TracedPass([]), TRACE, TraceFailure("on meta, boom", params=[ParamEntry("w", [3])])]),
    TraceFailure("--model x.py:build: its callable returned 2 values", "return", "Traceback ..."),
    RankDone(),
    RankError("RuntimeError: boom"),
    DeviceProfileResult({"schema": 1, "gemm": []}),
    ProfileProgress("gemm 3/9"),
    WorkerFailure("import", "ModuleNotFoundError: No module named 'x'", "Traceback ..."),
    Progress("intra all_reduce 8 B"),
    PhaseStarted("rotations"),
    CollectivesMeta([{"rank": 0, "host": "h", "node": "n"}], "2.5.0", "2.21.5", "12.4", "nccl"),
    CollectiveRow({"collective": "all_reduce", "size_bytes": 8, "time_us": 12.5}),
    CollectiveStopped("all_gather", "job", "stopped at 8 B: out of memory"),
    TrainingCalibration({"forward_s": 0.01, "backward_s": 0.02}, 2, 4, 50_000, 32),
    TrainingResult("ddp_synced", 0.2, [0.2], [[0.19, 0.2]], "max over ranks, median over steps", 2, 2, 2, 4, 50_000,
                   16, 32, {"vocab": 64}, 1, 0.05, "sgd", 0.1, "none", 1, "cpu", [12], [100, 200]),
    NumericsResult({"ddp_synced": {"allclose": True, "max_abs_diff_vs_single": 0.0}}, "float64", 1e-7, 1e-9,
                   0.1, 2, 4, 2, 50_000, "none"),
    ValidationRotations([[{"step_s": 0.2}, {"step_s": 0.21}]], ["ddp_synced"], 2, 2, 4, 50_000, 32,
                        {"vocab": 64}, 1, "cpu", "adamw", "none", None, 12.0),
    NodesResult([{"rank": 0, "host": "h", "topology": None}]),
    SleepStep(1, 2, 4242, "/probes/ranks/rank_main.py"),
]


def test_every_registered_class_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(registered().values())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_as_it_went_through_json(msg):
    wire = json.loads(json.dumps(encode(msg)))
    assert decode(wire) == msg


def test_the_wire_says_type_and_version_first_then_the_fields():
    assert encode(ProfileProgress("gemm 3/9")) == {"type": "profile_progress", "version": 1, "line": "gemm 3/9"}
    assert list(encode(WorkerFailure("build", "bad")))[:2] == ["type", "version"]


def test_every_message_is_frozen_and_its_kind_unique():
    kinds = [type(m).KIND for m in EXAMPLES]
    assert len(set(kinds)) == len(kinds)
    with pytest.raises(dataclasses.FrozenInstanceError):
        EXAMPLES[-1].reason = "other"  # type: ignore[attr-defined]


def test_an_unknown_type_is_refused_by_name():
    with pytest.raises(MessageError, match="unknown message type 'telepathy'"):
        decode({"type": "telepathy", "version": 1})
    with pytest.raises(MessageError, match="unknown message type None"):
        decode({"version": 1})


def test_another_version_is_refused_naming_both():
    wire = {**encode(ProfileJob()), "version": 2}
    with pytest.raises(MessageError, match="'profile_job' is version 2; this topoprof reads version 1"):
        decode(wire)


def test_fields_that_do_not_match_are_refused():
    with pytest.raises(MessageError, match=r"unknown fields \['colour'\], missing fields \[\]"):
        decode({**encode(ProfileProgress("x")), "colour": "red"})
    with pytest.raises(MessageError, match=r"missing fields \['reason', 'stage'\]"):
        decode({"type": "worker_failure", "version": 1})


def test_a_record_inside_a_message_comes_back_typed_and_its_fields_are_checked():
    msg = EXAMPLES[[type(m) for m in EXAMPLES].index(UserModelResult)]
    back = decode(json.loads(json.dumps(encode(msg))))
    assert isinstance(back, UserModelResult) and isinstance(back.record, UserModelRecord) and back.record.timed
    wire = encode(msg)
    with pytest.raises(MessageError, match=r"'user_model' \(version 5\)'s record does not match this topoprof's: "
                                           r"unknown fields \['colour'\]"):
        decode({**wire, "record": {**wire["record"], "colour": "red"}})
    # the records of a trace, each wherever it sits in a list, come back typed and checked the same
    traces = decode(json.loads(json.dumps(encode(OpTracesResult([TRACE, TraceFailure("on meta, boom")])))))
    assert isinstance(traces, OpTracesResult) and [type(t) for t in traces.traces] == [TracedPass, TraceFailure]
    back_trace = traces.traces[0]
    assert isinstance(back_trace, TracedPass) and isinstance(back_trace.ops[0], TracedOp)
    assert isinstance(back_trace.memory, PassMemory) and isinstance(back_trace.memory.kept, KeptByPlace)
    assert isinstance(back_trace.memory.kept.after_blocks_tensors[0], KeptTensor)
    assert isinstance(back_trace.memory.segments[0], MemorySegment) and isinstance(back_trace.by_name[0], OpSum)
    assert isinstance(back_trace.totals.forward, PhaseTotals) and back_trace == TRACE
    wire = encode(OpTraceResult(TRACE))
    op = {**wire["trace"]["ops"][0], "colour": "red"}
    with pytest.raises(MessageError, match=r"'op_trace' \(version 3\)'s trace's ops does not match this "
                                           r"topoprof's: unknown fields \['colour'\]"):
        decode({**wire, "trace": {**wire["trace"], "ops": [op]}})


def test_a_phase_beside_the_fields_is_the_envelope_not_a_field():
    assert decode({**encode(ProfileProgress("x")), "phase": "bench"}) == ProfileProgress("x")


def test_a_workers_failure_comes_back_typed_with_its_reason():
    failure = decode(encode(WorkerFailure("call", "TypeError: build() missing 'depth'", "Traceback ...")))
    assert isinstance(failure, WorkerFailure)
    assert (failure.stage, failure.reason, failure.trace) == ("call", "TypeError: build() missing 'depth'",
                                                              "Traceback ...")
    assert WorkerFailure("device", "no CUDA device").trace == ""


def test_the_launcher_reads_the_first_result_of_the_kinds_asked_for():
    run = RunResult(messages=[(0, {"type": "progress", "step": "starting"}),
                              (0, encode(ProfileProgress("gemm"))),
                              (0, encode(WorkerFailure("device", "no CUDA device"))),
                              (0, encode(DeviceProfileResult({"schema": 1})))],
                    failure=None, log_dir="", wall_s=0.0)
    assert worker_result(run, DeviceProfileResult, WorkerFailure) == WorkerFailure("device", "no CUDA device")
    assert worker_result(run, DeviceProfileResult) == DeviceProfileResult({"schema": 1})
    assert worker_result(run, UserModelResult) is None
    assert as_message({"type": "progress", "step": "starting"}, ProfileProgress) is None


def test_a_user_models_error_crosses_the_boundary_as_a_typed_failure(tmp_path):
    # The worker sends a WorkerFailure; the launcher's side makes it the user's InputError, with
    # the worker's traceback as its detail.
    from topoprof.errors import InputError
    from topoprof.measure.user_model import measure_user_model

    broken = tmp_path / "broken.py"
    broken.write_text("def build():\n    raise ValueError('no layers given')\n")
    with pytest.raises(InputError, match=r"build\(\) raised ValueError: no layers given") as err:
        measure_user_model(f"{broken}:build", "cpu", 1, timeout_s=120)
    assert "Traceback" in err.value.detail_text and "no layers given" in err.value.detail_text


def test_a_phase_carries_its_job_encoded_and_the_numerics_report_keeps_its_shape():
    job = CollectivesJob(["all_reduce"], [8], 3, 1, "float32", "avg")
    assert decode(phase("bench", "collectives", job)["config"]) == job
    numerics = NumericsResult({"ddp_synced": {"allclose": True}}, "float64", 1e-7, 1e-9, 0.1, 2, 4, 2, 100, "none")
    assert list(numerics.report()) == ["ddp_synced", "dtype", "rtol", "atol", "lr", "world_size", "accum",
                                       "micro_batch", "params", "ac"]
