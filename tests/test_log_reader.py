"""The training-log reader (memscope/inputs): prefixes, runs, gzip, folders, bad input."""

from __future__ import annotations

import gzip
import json
import os
import pathlib

import pytest

from memscope.events.bounded_input import InputRefused
from memscope.inputs import training_log
from memscope.inputs.log_lines import untag
from memscope.inputs.log_spec import LogOptions, run_spec, typed
from memscope.inputs.training_log import read_file_runs, read_runs

DATA = pathlib.Path(__file__).parent / "data" / "logs"
OOM_LOG = DATA / "gpt2_774m_fp16_oom_v100.log"
DENSE_LOG = DATA / "qwen2_0.5b_bf16_dp2.log"

MEMORY = (
    "[Rank {rank}] (after {it} iterations) memory (MB) | allocated: 1000.5 | max allocated: "
    "2000.25 | reserved: 2100.0 | max reserved: 2200.0"
)
ITERATION = (
    " [2025-03-31 05:54:07] iteration {it:8d}/     100 | consumed samples:          160 | "
    "elapsed time per iteration (ms): 820.7 | learning rate: 4.000000E-05 | global batch "
    "size:    16 | lm loss: 1.072453E+01 | loss scale: 131072.0 | number of skipped "
    "iterations: {skipped:3d} | number of nan iterations:   0 |"
)


def _args_block(**values: object) -> list[str]:
    """An arguments block as Megatron's ``_print_args`` prints it."""
    lines = ["------------------------ arguments ------------------------"]
    for name, value in sorted(values.items(), key=lambda kv: kv[0].lower()):
        lines.append(f"  {name} {'.' * (48 - len(name))} {value}")
    lines.append("-------------------- end of arguments ---------------------")
    return lines


TINY = dict(
    num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128,
    max_position_embeddings=128, padded_vocab_size=256, micro_batch_size=1,
    global_batch_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
    data_parallel_size=2, world_size=2, bf16=True, img_h=224, img_w=224, patch_dim=16,
    log_interval=1,
)  # fmt: skip


def _write(path: pathlib.Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _first_run(tmp_path: pathlib.Path, lines: list[str]) -> training_log.LogRun:
    """The first run the reader makes of ``lines`` written to a log."""
    return read_file_runs(_write(tmp_path / "log", lines))[0]


@pytest.mark.parametrize(
    ("line", "text", "tag", "rank"),
    [
        ("[default3]:[Rank 3] x", "[Rank 3] x", "default3", None),  # torchrun --tee
        ("[rank5]:[Rank 5] x", "[Rank 5] x", "rank5", 5),  # a prefix template with ${rank}
        ("[lrdn0137:7]:[Rank 7] x", "[Rank 7] x", "lrdn0137:7", 7),  # [host:rank]:
        ("12: [Rank 12] x", "[Rank 12] x", "12", 12),  # srun --label
        (" 6: [Rank 6] x", "[Rank 6] x", "6", 6),  # srun --label, padded
        ("node017: [Rank 1] x", "[Rank 1] x", "node017", None),  # pdsh
        ("2025-03-31T05:54:07.123Z [Rank 0] x", "[Rank 0] x", "", None),  # a timestamp
        ("[2024-04-04 09:09:53,313] 3: [Rank 3] x", "[Rank 3] x", "3", 3),  # both
        ("Traceback: not a prefix", "Traceback: not a prefix", "", None),
    ],
)
def test_launcher_prefixes_are_removed_and_name_the_writer(line, text, tag, rank):
    tagged = untag(line)
    assert (tagged.text, tagged.tag, tagged.rank) == (text, tag, rank)


def test_interleaved_ranks_keep_the_arguments_block_whole(tmp_path):
    block = _args_block(**TINY)
    lines = [f"[default0]:{block[0]}"]
    for i, line in enumerate(block[1:]):
        lines.append(f"[default0]:{line}")
        if i % 3 == 0:  # another rank's output printed meanwhile
            lines.append("[default1]:" + MEMORY.format(rank=1, it=i + 1))
    runs = read_file_runs(_write(tmp_path / "log", lines))
    assert len(runs) == 1
    assert runs[0].args is not None and runs[0].args["hidden_size"] == "64"
    assert len(runs[0].args) == len(TINY)
    assert {m.rank for m in runs[0].memory} == {1}


def test_two_runs_in_one_file_are_split_never_mixed(tmp_path):
    first = [*_args_block(**TINY), ITERATION.format(it=1, skipped=0), MEMORY.format(rank=0, it=1)]
    second = [*_args_block(**{**TINY, "hidden_size": 128}), ITERATION.format(it=1, skipped=0),
              MEMORY.format(rank=0, it=1)]  # fmt: skip
    runs = read_file_runs(_write(tmp_path / "log", first + second))
    assert [r.args["hidden_size"] for r in runs if r.args] == ["64", "128"]
    assert [len(r.memory) for r in runs] == [1, 1]


def test_iteration_going_back_starts_a_new_run(tmp_path):
    lines = [ITERATION.format(it=i, skipped=0) for i in (10, 20, 30, 10, 20)]
    runs = read_file_runs(_write(tmp_path / "log", lines))
    assert [[i.iteration for i in r.iterations] for r in runs] == [[10, 20, 30], [10, 20]]


def test_gzip_and_plain_logs_read_the_same(tmp_path):
    plain = OOM_LOG.read_bytes()
    packed = tmp_path / "log.gz"
    packed.write_bytes(gzip.compress(plain))
    a, b = read_runs([str(OOM_LOG)])[0], read_runs([str(packed)])[0]
    assert a.args == b.args and a.ooms[0].requested == b.ooms[0].requested == 786 * 2**20


def test_flagscale_logs_folder_reads_every_host_output_in_node_order(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs / "host_1_nodeb.output", ["[default0]:" + MEMORY.format(rank=2, it=1)])
    _write(logs / "host_0_nodea.output",
           [f"[default0]:{line}" for line in _args_block(**{**TINY, "world_size": 4,
                                                            "data_parallel_size": 4})]
           + ["[default0]:" + MEMORY.format(rank=0, it=1)])  # fmt: skip
    assert [os.path.basename(p) for p in training_log.log_files([str(logs)])] == [
        "host_0_nodea.output", "host_1_nodeb.output"]  # fmt: skip
    runs = read_runs([str(logs)])
    assert len(runs) == 1 and sorted(m.rank for m in runs[0].memory) == [0, 2]
    assert runs[0].args is not None


def test_a_folder_without_host_outputs_is_refused(tmp_path):
    with pytest.raises(InputRefused, match="host_"):
        read_runs([str(tmp_path)])


def test_skipped_iterations_are_kept_per_interval(tmp_path):
    lines = [ITERATION.format(it=10, skipped=10), ITERATION.format(it=20, skipped=6)]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert [(i.iteration, i.skipped) for i in run.iterations] == [(10, 10), (20, 6)]


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (  # torch <= 2.0
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB "
            "(GPU 0; 31.74 GiB total capacity; 28.82 GiB already allocated; 577.12 MiB free; "
            "29.97 GiB reserved in total by PyTorch) If reserved memory is >> allocated ...",
            dict(requested=786 * 2**20, free=int(577.12 * 2**20), allocated=int(28.82 * 2**30),
                 reserved_unallocated=int(29.97 * 2**30) - int(28.82 * 2**30)),
        ),
        (  # torch 2.1 ("capacty")
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacty of "
            "79.15 GiB of which 1.50 GiB is free. Process 12 has 77.63 GiB memory in use. Of "
            "the allocated memory 70.00 GiB is allocated by PyTorch, and 5.00 GiB is reserved "
            "by PyTorch but unallocated.",
            dict(requested=2 * 2**30, total=int(79.15 * 2**30), free=int(1.5 * 2**30),
                 allocated=70 * 2**30, reserved_unallocated=5 * 2**30, device=3),
        ),
        (  # torch >= 2.2, HIP
            "HIP out of memory. Tried to allocate 512.00 MiB. GPU  has a total capacity of "
            "191.98 GiB of which 100.00 MiB is free. Including non-PyTorch memory, this "
            "process has 191.00 GiB memory in use. Of the allocated memory 180.00 GiB is "
            "allocated by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA "
            "Graphs), and 9.00 GiB is reserved by PyTorch but unallocated.",
            dict(requested=512 * 2**20, free=100 * 2**20, allocated=180 * 2**30,
                 reserved_unallocated=9 * 2**30, process_in_use=191 * 2**30, device=None),
        ),
    ],
)  # fmt: skip
def test_every_out_of_memory_variant_is_read(tmp_path, message, fields):
    run = read_file_runs(_write(tmp_path / "log", [f"3: {message}"]))[0]
    oom = run.ooms[0]
    assert oom.rank == 3
    for name, value in fields.items():
        assert getattr(oom, name) == value, name


def test_command_line_and_torchrun_world_size_are_read(tmp_path):
    line = ("torchrun --nproc_per_node 8 --nnodes 2 --master_addr x pretrain_gpt.py "
            "--num-layers 24 --hidden-size 2048 --bf16 --data-path a b c --lr=4e-3")  # fmt: skip
    run = read_file_runs(_write(tmp_path / "log", [line, MEMORY.format(rank=0, it=10)]))[0]
    assert run.command is not None
    assert run.command["num_layers"] == "24" and run.command["bf16"] is True
    assert run.command["data_path"] == ["a", "b", "c"] and run.command["lr"] == "4e-3"
    assert run.launcher_world_size == 16


def test_echoed_flag_groups_are_the_command_line_and_the_launcher_world(tmp_path):
    """A launch script that echoes its bash arrays (``MODEL_ARGS: --num-layers 24 ...``)
    before running ``torchrun ... pretrain_gpt.py`` with all of them: the groups together are
    the command line, the group holding ``--nproc_per_node`` gives the world size."""
    lines = [
        "DISTRIBUTED_ARGS: --nproc_per_node 4 --nnodes 2 --node_rank 0 --master_addr x",
        "",
        "MODEL_ARGS: --num-layers 24 --hidden-size 512 --swiglu",
        "[default0]:MOE_ARGS: --num-experts 64 --moe-router-topk 1",
        "TRAINING_ARGS: --micro-batch-size 4 --bf16 --num-layers 99",
        MEMORY.format(rank=0, it=10),
    ]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert run.command is not None and run.launcher_world_size == 8
    assert run.command["num_layers"] == "24", "the first group to name a flag keeps it"
    assert run.command["num_experts"] == "64" and run.command["bf16"] is True
    assert run.command["swiglu"] is True and "nproc_per_node" not in run.command
    assert run.command_where.endswith(":3")
    # a shouted word before a colon that is no flag group is not one
    other = read_file_runs(_write(tmp_path / "o", ["ERROR_ARGS: none here", MEMORY.format(
        rank=0, it=10)]))  # fmt: skip
    assert not other or other[0].command is None


def test_printed_values_are_typed_as_megatron_had_them():
    assert typed("None") is None and typed("True") is True and typed("64") == 64
    assert typed("1e-05") == 1e-05 and typed("[2, 1]") == [2, 1]
    assert typed("torch.bfloat16") == "torch.bfloat16" and typed("[unclosed") == "[unclosed"


def test_vision_defaults_of_an_args_dump_do_not_refuse_a_gpt_run():
    """Every real dump prints img_h 224 (Megatron's default): the OOM fixture is GPT-2."""
    run = read_runs([str(OOM_LOG)])[0]
    assert run.args is not None and run.args["img_h"] == "224"
    spec = run_spec(run).spec
    assert spec.model.hidden_size == 1280 and spec.model.vocab_size == 50304


def test_a_real_vision_setting_still_refuses(tmp_path):
    lines = [*_args_block(**{**TINY, "img_h": 448}), MEMORY.format(rank=0, it=1)]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    with pytest.raises(ValueError, match="img_h"):
        run_spec(run)


def test_world_size_sources_must_agree(tmp_path):
    run = read_file_runs(
        _write(tmp_path / "log", [*_args_block(**TINY), MEMORY.format(rank=0, it=1)])
    )[0]
    assert run_spec(run).world_size == 2
    with pytest.raises(ValueError, match="contradicts"):
        run_spec(run, LogOptions(world_size=4))


# --- bad input -------------------------------------------------------------------------


def test_binary_junk_is_refused(tmp_path):
    path = tmp_path / "junk.log"
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(InputRefused, match="binary"):
        read_runs([str(path)])


def test_a_truncated_arguments_block_is_refused(tmp_path):
    lines = _args_block(**TINY)[:-3]
    with pytest.raises(InputRefused, match="truncated"):
        read_runs([_write(tmp_path / "log", lines)])


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputRefused, match="FIFO"):
        read_runs([str(fifo)])


def test_a_damaged_gzip_is_refused(tmp_path):
    path = tmp_path / "log.gz"
    path.write_bytes(gzip.compress(OOM_LOG.read_bytes())[:500])
    with pytest.raises(InputRefused, match="gzip"):
        read_runs([str(path)])


def test_overlong_lines_are_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(training_log, "MAX_LINE_BYTES", 200)
    lines = ["x" * 1000, MEMORY.format(rank=0, it=1)]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert run.cut_lines == 1 and len(run.memory) == 1


def test_records_beyond_the_cap_are_counted_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(training_log, "MAX_RECORDS", 3)
    lines = [MEMORY.format(rank=r, it=1) for r in range(5)]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert len(run.memory) == 3 and run.dropped == 2


def test_a_long_log_keeps_at_most_the_record_cap(tmp_path, monkeypatch):
    """Streaming: a log of 60k iteration lines keeps MAX_RECORDS of them, counts the rest
    (tools/bench_log_reader.py measures a multi-gigabyte one)."""
    monkeypatch.setattr(training_log, "MAX_RECORDS", 10_000)
    path = tmp_path / "big.log"
    with open(path, "w") as f:
        f.write("\n".join(_args_block(**TINY)) + "\n")
        for i in range(1, 60_001):
            f.write(ITERATION.format(it=i, skipped=0) + "\n")
    run = read_runs([str(path)])[0]
    assert len(run.iterations) == training_log.MAX_RECORDS
    assert run.dropped == 60_000 - training_log.MAX_RECORDS


def test_two_real_runs_in_one_log_and_memory_lines_sharing_a_line():
    """The tutorial log holds two TP=4 runs; the second printed two ranks' lines on one."""
    runs = read_runs([str(DATA / "gpt2_345m_tp4_fp16_two_runs.log")])
    assert len(runs) == 2
    for run in runs:
        assert run.args is not None and run.args["tensor_model_parallel_size"] == "4"
        assert sorted(m.rank for m in run.memory) == [0, 1, 2, 3]
        assert [(i.iteration, i.skipped) for i in run.iterations][:2] == [(10, 10), (20, 5)]
        assert run.unpadded_vocab == 50257 and run.world_size == 4
    assert runs[0].memory[0].max_allocated_mb == 2589.13525390625
    assert runs[1].memory[0].max_allocated_mb == 4673.77880859375


def test_an_oom_in_a_flagscale_host_file_gets_its_global_rank(tmp_path):
    """host_1_*.output of a 2-node, 8-rank job: torchrun's [default2] is global rank 6."""
    from memscope.inputs.log_document import explain_run

    logs = tmp_path / "logs"
    logs.mkdir()
    tiny = {**TINY, "world_size": 8, "data_parallel_size": 8, "global_batch_size": 8}
    _write(logs / "host_0_a.output", [f"[default0]:{line}" for line in _args_block(**tiny)])
    message = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a "
        "total capacity of 79.15 GiB of which 1.50 GiB is free. Of the allocated memory 70.00 "
        "GiB is allocated by PyTorch, and 5.00 GiB is reserved by PyTorch but unallocated."
    )
    _write(logs / "host_1_b.output", [f"[default2]:{message}"])
    run = read_runs([str(logs)])[0]
    assert run.ooms[0].node == 1 and run.ooms[0].tag == "default2"
    assert explain_run(run)["ooms"][0]["rank"] == 6


def test_v016_memory_lines_two_decimals_and_device_memory_suffix(tmp_path):
    """Megatron-LM v0.16 prints ``:.2f`` numbers and, with --log-device-memory-used, a
    ``total device memory used`` field; checkpoint-time lines are not iterations."""
    lines = [
        "[Rank 0] (after 1 iterations) memory (MB) | allocated: 4806.14 | max allocated: 7116.91 "
        "| reserved: 7724.00 | max reserved: 7724.00 | total device memory used: 8600.00",
        "[Rank 0] (before save_checkpoint for iteration 2) memory (MB) | allocated: 1.00 | max "
        "allocated: 2.00 | reserved: 3.00 | max reserved: 4.00",
    ]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert [(m.iteration, m.max_allocated_mb, m.reserved_mb) for m in run.memory] == [
        (1, 7116.91, 7724.0)]  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_mangled_real_logs_give_a_report_or_one_line_error(tmp_path, seed):
    """Fuzz-ish: a fixture cut, with lines dropped, duplicated or shuffled, bytes flipped or
    a value replaced, never raises anything but the readers' one-line error."""
    import random

    from memscope.cli.analyze_log_cmd import analyze_logs
    from memscope.cli.common import CliError

    rng = random.Random(seed)
    source = rng.choice(sorted(DATA.glob("*.log")))
    lines = source.read_bytes().split(b"\n")
    for _ in range(rng.randint(1, 6)):
        if not lines:
            break  # a short fixture cut to nothing
        i = rng.randrange(len(lines))
        kind = rng.choice(("drop", "dup", "swap", "flip", "value", "cut"))
        if kind == "drop":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "flip" and lines[i]:
            k = rng.randrange(len(lines[i]))
            lines[i] = lines[i][:k] + bytes([rng.randrange(256)]) + lines[i][k + 1 :]
        elif kind == "value":
            value = rng.choice([b"-1", b"0", b"1e400", b"nan", b"[[[", b"None", b"9" * 40])
            lines[i] = lines[i].rsplit(b" ", 1)[0] + b" " + value
        elif kind == "cut":
            lines = lines[:i]
    log = tmp_path / source.name
    log.write_bytes(b"\n".join(lines))
    try:
        doc = analyze_logs(
            [str(log)], LogOptions(vocab_size=151936 if "qwen" in source.name else None)
        )
    except CliError as exc:
        assert "\n" not in str(exc)
    else:
        assert doc["report_type"] == "log"
        json.dumps(doc, allow_nan=False)  # what is written is valid JSON


def test_an_old_memory_line_without_its_rank_is_rank_zeros(tmp_path):
    """Megatron-LM of 2020 printed the line without ``[Rank N]`` (NVIDIA/Megatron-LM#60)."""
    lines = [
        " iteration        5/  120000 | elapsed time per iteration (ms): 16491.5 | learning rate:"
        " 0.000E+00 | loss scale: 268435456.0 | number of skipped iterations:   5 | number of "
        "nan iterations:   0 |",
        "after 5 iterations memory (MB) | allocated: 10250.5693359375 | max allocated: "
        "12606.06201171875 | reserved: 17482.0 | max reserved: 17482.0",
    ]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert [(m.rank, m.iteration, m.max_allocated_mb) for m in run.memory] == [
        (0, 5, 12606.06201171875)]  # fmt: skip
    assert [(i.iteration, i.skipped) for i in run.iterations] == [(5, 5)]


def test_a_command_continued_with_backslashes_is_one_command_line(tmp_path):
    """A launch script echoed into the log (``cat $0``, a pasted sbatch file): its command
    runs over lines ending in a backslash, flag lines holding none of the reader's words
    (gnosia93/slurm-on-aws's 70B lesson pastes one so). The parts are one command line;
    a comment after the last part is not in it."""
    lines = [
        "#SBATCH --nodes=4",
        "srun torchrun --nproc_per_node=8 \\",
        "  --nnodes=2 \\",
        "  --rdzv_backend=c10d \\",
        "  pretrain_gpt.py \\",
        "    --tensor-model-parallel-size 4 \\",
        "    --pipeline-model-parallel-size 4 \\",
        "    --num-layers 80 \\",
        "    --recompute-granularity full \\",
        "    --log-interval 1",
        "",
        "#   --data-path /fsx/data/my-dataset_text_document \\",
        "#   --num-layers 2",
        MEMORY.format(rank=0, it=1),
    ]
    run = _first_run(tmp_path, lines)
    assert run.command is not None and run.command_where.endswith(":2")
    assert run.command["tensor_model_parallel_size"] == "4"
    assert run.command["num_layers"] == "80" and run.command["log_interval"] == "1"
    assert run.command["recompute_granularity"] == "full" and "data_path" not in run.command
    assert run.launcher_world_size == 16  # torchrun's 8 per node x 2 nodes, from part 1-2
    assert [m.rank for m in run.memory] == [0]


def test_a_log_ending_inside_a_continued_command_still_reads_it(tmp_path):
    lines = ["[default0]:pretrain_gpt.py --num-layers 2 \\", "[default0]:  --hidden-size 64 \\"]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert run.command == {"num_layers": "2", "hidden_size": "64"}


def test_a_runaway_continuation_is_dropped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(training_log, "MAX_JOINED_BYTES", 64)
    lines = ["pretrain_gpt.py --num-layers 2 \\"] + ["  --hidden-size 64 \\"] * 20
    lines += ["  --bf16", MEMORY.format(rank=0, it=1)]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert run.command is None and run.cut_lines == 1 and len(run.memory) == 1


def test_a_2020_memory_line_with_cached_for_reserved_is_read(tmp_path):
    """Megatron-LM of 2019-20 on torch < 1.4 printed ``cached`` / ``max cached`` (a log
    pasted in a blog on DeepSpeedExamples' Megatron-LM, GPT-2 345M on one GPU)."""
    lines = [
        "using world size: 1 and model-parallel size: 1 ",
        " iteration      100/  320000 | elapsed time per iteration (ms): 963.3 | learning rate "
        "3.937E-06 | lm loss 8.995377E+00 | loss scale 131072.0 |",
        "after 100 iterations memory (MB) | allocated: 6784.88427734375 | max allocated: "
        "11927.470703125 | cached: 13826.0 | max cached: 13826.0",
    ]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    assert [(m.rank, m.iteration, m.max_allocated_mb, m.reserved_mb, m.max_reserved_mb)
            for m in run.memory] == [(0, 100, 11927.470703125, 13826.0, 13826.0)]  # fmt: skip
    assert run.world_size == 1


BRIDGE = (
    "[Rank {rank}] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 63.66 | "
    "mem-active-gigabytes: 63.66 | mem-inactive-gigabytes: 20.563 | mem-reserved-gigabytes: "
    "182.2 | mem-max-allocated-gigabytes: 153.4 | mem-max-active-gigabytes: 169.96 | "
    "mem-max-inactive-gigabytes: 32.473 | mem-max-reserved-gigabytes: 182.2 | "
    "mem-alloc-retires: 0 | mem-allocated-count: 507"
)


def test_a_megatron_bridge_memory_line_in_decimal_gigabytes_is_read(tmp_path):
    """Megatron-Bridge's report_memory prints ``torch.cuda.memory_stats()`` in GB of 10**9
    bytes (train_utils.py: ``memory_stats[...] / 1.0e9``); the reader keeps MB of 2**20."""
    lines = [
        "p4_v2_perf/0 " + BRIDGE.format(rank=1),
        "[default2]:" + BRIDGE.format(rank=2),
        # custom memory_keys without the four figures: not a memory report
        "[Rank 3] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 1.5",
    ]
    run = read_file_runs(_write(tmp_path / "log", lines))[0]
    mib = 2**20
    assert [m.rank for m in run.memory] == [1, 2]
    first = run.memory[0]
    assert first.iteration == 2
    assert round(first.max_allocated_mb * mib) == 153_400_000_000
    assert round(first.allocated_mb * mib) == 63_660_000_000
    assert round(first.reserved_mb * mib) == round(first.max_reserved_mb * mib) == 182_200_000_000


def test_a_shard_count_contradicting_the_command_line_is_noted(tmp_path):
    """A log whose echoed command is not what ran (gnosia93/slurm-on-aws's 70B lesson pastes a
    PP 4 script above a PP 8 run's output): Megatron's printed shard count disagrees with the
    one the configuration gives, and the run says so. A count that agrees adds no note."""
    from memscope.cli.analyze_log_cmd import analyze_logs
    from memscope.inputs.log_document import megatron_shard_params

    command = ("torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 8 --hidden-size 256 "
               "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
               "--micro-batch-size 1 --global-batch-size 4 --pipeline-model-parallel-size 2 "
               "--tensor-model-parallel-size 2 --bf16 --vocab-size 1000")  # fmt: skip
    first = _write(tmp_path / "a", [command, MEMORY.format(rank=0, it=2)])
    spec = run_spec(read_file_runs(first)[0]).spec
    ours = megatron_shard_params(spec) / 1e9
    notes = {}
    for name, printed in (("agrees", ours), ("half", ours / 2)):
        shard = f"Number of parameters in most loaded shard in billions: {printed:.4f}"
        log = _write(tmp_path / name, [command, shard, MEMORY.format(rank=0, it=2)])
        notes[name] = [n for n in analyze_logs([log])["runs"][0]["notes"] if "shard" in n]
    assert notes["agrees"] == []
    assert len(notes["half"]) == 1 and "probably not the one that ran" in notes["half"][0]
    assert "command line" in notes["half"][0]


def test_prefix_numbers_that_are_no_global_ranks_do_not_place_an_oom(tmp_path):
    """The last rank prints the iteration lines: when their ``[host:N]:`` prefix says another
    number than world size - 1 (a wrapper printing the rank within the node, as
    OpenEuroLLM's Leonardo log does), an out-of-memory message's prefix is not its rank."""
    from memscope.inputs.log_document import explain_run

    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has "
           "a total capacity of 79.15 GiB of which 1.50 GiB is free. Of the allocated memory "
           "70.00 GiB is allocated by PyTorch, and 3.00 GiB is reserved by PyTorch but "
           "unallocated.")  # fmt: skip

    def explained(world: int) -> dict:
        sizes = {"world_size": world, "data_parallel_size": world, "global_batch_size": world}
        args = _args_block(**{**TINY, **sizes})
        lines = [*args, "[nodeb:1]:" + ITERATION.format(it=1, skipped=0), "[nodeb:1]:" + oom]
        return explain_run(read_file_runs(_write(tmp_path / f"w{world}", lines))[0])

    two = explained(2)  # the last rank is 1: the prefixes number global ranks
    assert [o["rank"] for o in two["ooms"]] == [1]
    assert not [n for n in two["notes"] if "not global ranks" in n]
    four = explained(4)  # the last rank is 3, its prefix says 1: no global ranks
    assert [o["rank"] for o in four["ooms"]] != [1]
    assert len([n for n in four["notes"] if "not global ranks" in n]) == 1


def test_an_unfinished_arguments_block_after_a_run_keeps_the_run(tmp_path):
    """A tutorial pasting its third run's arguments block elided (hwang2006's
    docs/06_tensor_parallelism.md: ``  .`` lines, no end line) after two complete runs: the
    runs before it are read, the unfinished block is named in a note, not read."""
    from memscope.inputs.log_document import explain_run

    first = [*_args_block(**TINY), ITERATION.format(it=1, skipped=0), MEMORY.format(rank=0, it=1)]
    elided = [*_args_block(**TINY)[:4], "  .", "  .", "```", "prose after the block"]
    runs = read_runs([_write(tmp_path / "log", [*first, *elided])])
    assert len(runs) == 1 and [m.rank for m in runs[0].memory] == [0]
    assert runs[0].unfinished_args_where == f"log:{len(first) + 1}"
    notes = explain_run(runs[0])["notes"]
    assert [n for n in notes if "has no end line" in n]


def test_a_second_launch_after_a_run_that_trained_is_a_new_run(tmp_path):
    """Runs concatenated with their launch lines only (SeunghyunSEO/Megatron-LM's MoE README
    pastes the flag groups of each run before its output): a command line or a flag group
    after a run that printed memory or iterations starts the next run, never mixed."""
    groups = ["MODEL_ARGS: --num-layers 4 --hidden-size 64", "MOE_ARGS: --num-experts {e}"]
    command = "torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers {n} --hidden-size 64"
    lines = [*(g.format(e=4) for g in groups), ITERATION.format(it=20, skipped=0),
             MEMORY.format(rank=0, it=20),
             *(g.format(e=8) for g in groups), MEMORY.format(rank=0, it=20),
             ITERATION.format(it=20, skipped=0),
             command.format(n=6), ITERATION.format(it=20, skipped=0), MEMORY.format(rank=0, it=20),
             command.format(n=8), MEMORY.format(rank=0, it=20)]  # fmt: skip
    runs = read_file_runs(_write(tmp_path / "log", lines))
    assert [r.command["num_experts"] if "num_experts" in r.command else r.command["num_layers"]
            for r in runs if r.command] == ["4", "8", "6", "8"]  # fmt: skip
    assert [len(r.memory) for r in runs] == [1, 1, 1, 1]
    assert [r.command_where for r in runs] == ["log:1", "log:5", "log:9", "log:12"]
