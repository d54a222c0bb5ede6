"""One training step of the small transformer, mock + mockccl vs cpu + gloo, same run, same 4
rank processes.

The conformance area's model (``accelkit.conformance.checks._transformer``) at a bench size,
trained with AdamW four ways: FSDP2 (``fully_shard`` per block and on the root, all ranks),
FSDP2 x TP (TP on the ``tp`` dim of a (2, ranks/2) mesh, FSDP2 on ``dp``), a pipeline of one
stage per rank (``Schedule1F1B``), and 3-D: 2 pipeline stages on a (2, ranks/4, 2) mesh, each
stage's blocks TP on ``tp`` and FSDP2 on ``dp``. One process group
``mock:mockccl,cpu:gloo``: the model on mock tensors communicates through mockccl, the same
model on CPU tensors through gloo. Each timed round runs ``--steps`` steps of each layout on
mock and on cpu, alternating step by step so that both see the same load from other jobs on
the shared machine; a step's time is the slowest rank's, a round's the mean of its steps. The
step time reported is the median of the rounds, mock/cpu the median of the rounds' ratios,
tokens/s the global tokens per step over the step time. Checks the goal (mock <= 0.8 x cpu
step time), saves a PNG and
the raw numbers (JSON). ``--profile`` adds, for ``--steps`` more steps of each pair on rank 0
(torch.profiler), the self CPU time per step by category (collectives, DTensor dispatch, aten kernels,
other) and the top ops, to show what dominates.

    python bench/training.py [--out bench/results] [--rounds 5] [--steps 3] [--profile]
        [--layouts fsdp2,...] [--no-readme] [--no-plot]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _ranks import run_ranks
from _results import environment, write_section

LAYOUTS = ("fsdp2", "fsdp2_tp", "pp", "pp_fsdp2_tp")
#: The layouts' names in the table and the plot.
TITLES = {"fsdp2": "FSDP2", "fsdp2_tp": "FSDP2 x TP", "pp": "PP (1F1B)",
          "pp_fsdp2_tp": "PP x FSDP2 x TP (3-D)"}
DEVICES = ("mock", "cpu")
#: The goal: mock step time at most this fraction of cpu's.
GOAL = 0.8


def build(layout: str, device: str, rank: int, world: int, cfg):
    """The model (seeded alike on every rank) laid out on ``device``, its optimizer, and this
    rank's (data-parallel size, data-parallel rank)."""
    import torch
    from accelkit.conformance.checks._transformer import Transformer, tp_plan
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    if layout == "fsdp2":
        mesh = init_device_mesh(device.split(":")[0], (world,))
        dp_mesh, dp, dp_rank = mesh, world, rank
    else:
        mesh = init_device_mesh(device.split(":")[0], (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan(model))
        dp_mesh, dp, dp_rank = mesh["dp"], 2, mesh.get_local_rank("dp")
    for layer in model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    # foreach on both devices: torch defaults to it only on accelerators (the mock), to a
    # per-parameter loop on CPU, which would compare two optimizer implementations
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True), dp, dp_rank


def stage_module(model, index: int, count: int):
    """Stage ``index`` of ``count`` of the transformer, as torchtitan splits it: the embedding
    on the first, an even share of the blocks, the norm and the output on the last (in that
    order, the transformer's forward)."""
    from torch import nn

    per = len(model.layers) // count
    parts = [model.tok_embeddings] if index == 0 else []
    parts += list(model.layers[index * per:(index + 1) * per])
    parts += [model.norm, model.output] if index == count - 1 else []
    return nn.Sequential(*parts)


def build_pipelined(layout: str, device: str, rank: int, world: int, cfg, batch, microbatches: int):
    """A pipelined layout's step: ``pp`` (one stage per rank, Schedule1F1B) or ``pp_fsdp2_tp``
    (a (2, world/4, 2) mesh: 2 stages, each tensor-parallel on ``tp`` and FSDP2 on ``dp``); the
    data-parallel size and this rank's data-parallel index."""
    import torch
    from accelkit.conformance.checks._transformer import Transformer, loss_fn, tp_plan
    from torch.distributed import pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    model = Transformer(cfg)
    if layout == "pp":
        stage, stages, group, dp, dp_rank = rank, world, None, 1, 0
        module = stage_module(model, stage, stages).to(device)
    else:
        mesh = init_device_mesh(device.split(":")[0], (2, world // 4, 2), mesh_dim_names=("pp", "dp", "tp"))
        stage, stages, group = mesh["pp"].get_local_rank(), 2, mesh["pp"].get_group()
        dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
        module = stage_module(model, stage, stages).to(device)
        plan = {k.removeprefix(f"layers.{i}."): v for i in range(len(model.layers))
                for k, v in tp_plan(model).items() if k.startswith(f"layers.{i}.")}
        blocks = [m for m in module if m in set(model.layers)]
        for layer in blocks:  # the blocks' plan (embedding and output stay replicated)
            parallelize_module(layer, mesh["tp"], plan)
        for layer in blocks:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(module, mesh=mesh["dp"])
    schedule = pipelining.Schedule1F1B(
        pipelining.PipelineStage(module, stage, stages, torch.device(device), group=group),
        n_microbatches=microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=True)
    first, last = stage == 0, stage == stages - 1
    local = batch.chunk(dp)[dp_rank].to(device)

    def step():
        schedule.step(*((local,) if first else ()), target=local if last else None)
        opt.step()
        opt.zero_grad()

    return step, dp


def make_step(model, opt, batch):
    from accelkit.conformance.checks._transformer import loss_fn

    def step():
        loss_fn(model(batch), batch).backward()
        opt.step()
        opt.zero_grad()

    return step


def slowest(seconds: float) -> float:
    """The largest ``seconds`` over the ranks (through gloo)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


#: Profiler event names by where the time goes (first matching prefix wins; else "other":
#: autograd nodes, FSDP's hooks, the optimizer's Python).
CATEGORIES = (
    ("collectives", ("c10d::", "_c10d_functional::", "FSDP::all_gather", "FSDP::post_backward_reduce")),
    ("DTensor dispatch", ("PythonSubclass", "_FromTorchTensor", "_ToTorchTensor", "Redistribute",
                          "NestedRedistribute")),
    ("aten kernels", ("aten::",)),
)


def profile_steps(step, n: int) -> dict:
    """``n`` steps under torch.profiler: self CPU time per step by category (``CATEGORIES``)
    and the 10 ops with the largest self time per step (rank 0 reports them)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    events = prof.key_averages()
    by_category: dict[str, float] = {}
    for e in events:
        name = next((c for c, prefixes in CATEGORIES if e.key.startswith(prefixes)), "other")
        by_category[name] = by_category.get(name, 0.0) + e.self_cpu_time_total / 1e3 / n
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return {"by_category_ms": by_category,
            "top": [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3 / n, "calls": e.count // n}
                    for e in top]}


def rank_main(rank: int, world: int, port: int, out: str, opts: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import warnings

    # FSDP2 warns that the root returns a view (nn.Linear on 3-D input does, on any device).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    import accelkit.backends.mock  # noqa: F401
    import torch
    import torch.distributed as dist
    from accelkit.conformance.checks._transformer import Config, tokens

    torch.set_num_threads(1)
    torch.mock.set_device(rank)
    dist.init_process_group("mock:mockccl,cpu:gloo", rank=rank, world_size=world)
    cfg = Config(vocab=opts["vocab"], dim=opts["dim"], heads=opts["heads"], hidden=opts["hidden"],
                 layers=opts["layers"])
    steps, pairs = {}, {}
    for layout in opts["layouts"]:
        for device in DEVICES:
            dev = f"mock:{rank}" if device == "mock" else "cpu"
            if layout.startswith("pp"):
                # the pipeline carries the batch the data-parallel layouts spread over all ranks
                global_batch = tokens(opts["batch"] * world, opts["seq"], seed=1, vocab=cfg.vocab)
                steps[(layout, device)], dp = build_pipelined(layout, dev, rank, world, cfg, global_batch,
                                                              opts["microbatches"])
            else:
                model, opt, dp, dp_rank = build(layout, dev, rank, world, cfg)
                global_batch = tokens(opts["batch"] * dp, opts["seq"], seed=1, vocab=cfg.vocab)
                local = global_batch.chunk(dp)[dp_rank].to(dev)
                steps[(layout, device)] = make_step(model, opt, local)
            pairs[(layout, device)] = {"tokens": global_batch.numel(), "dp": dp}
    for step in steps.values():
        for _ in range(opts["warmup"]):
            step()
    rounds = {key: [] for key in steps}
    for _ in range(opts["rounds"]):
        for layout in opts["layouts"]:
            total = dict.fromkeys(DEVICES, 0.0)
            for _ in range(opts["steps"]):
                for device in DEVICES:  # alternate step by step: both see the same load
                    dist.barrier()
                    t0 = time.perf_counter()
                    steps[(layout, device)]()
                    total[device] += slowest(time.perf_counter() - t0)
            for device in DEVICES:
                rounds[(layout, device)].append(total[device] / opts["steps"])
        if rank == 0:
            print("  round: " + ", ".join(f"{k[0]}/{k[1]} {v[-1] * 1e3:.0f} ms" for k, v in rounds.items()),
                  file=sys.stderr, flush=True)
    profiles = ({f"{k[0]}/{k[1]}": profile_steps(s, opts["steps"]) for k, s in steps.items()}
                if opts["profile"] else {})
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        rows = [{"layout": k[0], "device": k[1], **pairs[k], "rounds_seconds": v,
                 "seconds": statistics.median(v)} for k, v in rounds.items()]
        Path(out).write_text(json.dumps({"world": world, "config": opts, "rows": rows,
                                         "profiles": profiles}))


def paired_ratio(mock: dict, cpu: dict) -> float:
    """The median over rounds of mock/cpu round time (the two alternate within a round, so
    each ratio compares steps run under the same load)."""
    return statistics.median(m / c for m, c in zip(mock["rounds_seconds"], cpu["rounds_seconds"], strict=True))


def report(data: dict) -> tuple[str, bool]:
    """The results table (markdown), the profiles if any, and whether the goal is met."""
    by = {(r["layout"], r["device"]): r for r in data["rows"]}
    lines = ["| layout | mock step | cpu step | mock/cpu (paired) | mock tokens/s | cpu tokens/s |",
             "|---|---|---|---|---|---|"]
    ok = True
    verdicts = []
    for layout in data["config"]["layouts"]:
        m, c = by[(layout, "mock")], by[(layout, "cpu")]
        ratio = paired_ratio(m, c)
        lines.append(f"| {TITLES[layout]} | {m['seconds'] * 1e3:.0f} ms | {c['seconds'] * 1e3:.0f} ms | {ratio:.2f} | "
                     f"{m['tokens'] / m['seconds']:,.0f} | {c['tokens'] / c['seconds']:,.0f} |")
        met = ratio <= GOAL
        ok = ok and met
        verdicts.append(f"{'PASS' if met else 'MISS'}  {layout}: mock {ratio:.2f} x cpu step time (<= {GOAL})")
    for name, prof in data.get("profiles", {}).items():
        split = ", ".join(f"{c} {ms:.0f} ms" for c, ms in sorted(prof["by_category_ms"].items(),
                                                                  key=lambda kv: -kv[1]))
        lines += ["", f"rank 0, {name}, self CPU time per step: {split}; top ops:"]
        lines += [f"  {r['self_ms']:8.1f} ms  {r['calls']:5d} x  {r['op']}" for r in prof["top"]]
    return "\n".join(lines + [""] + verdicts), ok


BEGIN, END = "<!-- training.py: begin -->", "<!-- training.py: end -->"


def readme_section(data: dict, table: str, argv: list[str]) -> str:
    """bench/README.md's generated part of "Training step": the run's command, environment,
    table and verdicts."""
    env, cfg = data["environment"], data["config"]
    load = lambda v: f"{v[0]:.1f}"  # noqa: E731  (1-minute average)
    return "\n".join([
        BEGIN, "", f"`{' '.join(['python bench/training.py', *argv])}`",
        f"(regenerates this part, `bench/results/training.json` and `training.png`). Measured "
        f"{env['date']}, commit {env['commit']}, torch {env['torch']}, {env['cpus']} CPUs, "
        f"load average {load(env['load_before'])} before and {load(env['load_after'])} after; "
        f"{data['world']} ranks, dim {cfg['dim']}, {cfg['layers']} blocks, vocabulary {cfg['vocab']}, "
        f"{cfg['batch']} sequences of {cfg['seq']} tokens per data-parallel rank (the pipelined "
        f"layouts carry the same global batch in {cfg['microbatches']} micro-batches), "
        f"{cfg['rounds']} rounds of {cfg['steps']} steps.", "",
        "\n".join(f"- {line}" if line.startswith(("PASS", "MISS")) else line for line in table.splitlines()),
        "",
        "![training step](results/training.png)", "", END])


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["layout"], r["device"]): r for r in data["rows"]}
    layouts = data["config"]["layouts"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for i, device in enumerate(DEVICES):
        label = "mock + mockccl" if device == "mock" else "cpu + gloo"
        xs = [j + (i - 0.5) * width for j in range(len(layouts))]
        rows = [by[(layout, device)] for layout in layouts]
        axes[0].bar(xs, [r["seconds"] * 1e3 for r in rows], width, label=label)
        for x, r in zip(xs, rows, strict=True):
            axes[0].plot([x] * len(r["rounds_seconds"]), [s * 1e3 for s in r["rounds_seconds"]], "k.", ms=3)
        axes[1].bar(xs, [r["tokens"] / r["seconds"] for r in rows], width, label=label)
    for j, layout in enumerate(layouts):
        m, c = by[(layout, "mock")], by[(layout, "cpu")]
        axes[0].annotate(f"{paired_ratio(m, c):.2f}x", (j, max(m["seconds"], c["seconds"]) * 1e3),
                         ha="center", va="bottom")
    cfg = data["config"]
    for ax, title in ((axes[0], "step time, ms (dots: rounds; mock/cpu)"), (axes[1], "tokens / s")):
        ax.set_xticks(range(len(layouts)), [TITLES[layout] for layout in layouts], fontsize=7)
        ax.set_title(f"{title}, {data['world']} ranks")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    fig.suptitle(f"transformer dim {cfg['dim']}, {cfg['layers']} layers, vocab {cfg['vocab']}, "
                 f"{cfg['batch']} x {cfg['seq']} tokens per data-parallel rank, AdamW")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed rounds (every layout and device in each); median reported")
    parser.add_argument("--steps", type=int, default=3, help="steps per pair and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per pair first")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2, help="sequences per data-parallel rank")
    parser.add_argument("--microbatches", type=int, default=4,
                        help="micro-batches of a pipelined step (a multiple of the stages)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma-separated, of {', '.join(LAYOUTS)} (a subset needs --no-readme)")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    parser.add_argument("--no-plot", action="store_true", help="do not draw training.png")
    parser.add_argument("--profile", action="store_true",
                        help="profile --steps more steps of each layout and device on rank 0 "
                             "(time by category, top ops)")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.ranks < 4 or args.ranks % 4:
        parser.error(f"--ranks must be a multiple of 4 (FSDP2 x TP uses a (2, ranks/2) mesh, the "
                     f"3-D layout a (2, ranks/4, 2) one), got {args.ranks}")
    if args.layers % args.ranks or args.microbatches % args.ranks:
        parser.error(f"--layers and --microbatches must be multiples of --ranks ({args.ranks}): "
                     "the pipeline has one stage per rank")
    layouts = args.layouts.split(",")
    if unknown := [x for x in layouts if x not in LAYOUTS]:
        parser.error(f"--layouts: unknown {', '.join(unknown)}; choose from {', '.join(LAYOUTS)}")
    if set(layouts) != set(LAYOUTS) and not args.no_readme:
        parser.error("--layouts with a subset of the layouts needs --no-readme (README.md's table "
                     "has every layout)")
    tp = args.ranks // 2
    if args.heads % tp or args.vocab % tp or args.hidden % tp:
        parser.error(f"--heads, --vocab and --hidden must be multiples of the TP size {tp}")
    opts = {k: getattr(args, k) for k in ("rounds", "steps", "warmup", "dim", "heads", "hidden", "layers",
                                          "vocab", "seq", "batch", "microbatches", "profile")}
    opts["layouts"] = layouts
    start = time.monotonic()
    env = environment()
    data = run_ranks(__file__, args.ranks, args.out / "training.json", json.dumps(opts))
    if data is None:
        return 2
    raw = args.out / "training.json"
    data["environment"] = {**env, "load_after": os.getloadavg()}
    raw.write_text(json.dumps(data, indent=1) + "\n")
    text, ok = report(data)
    print(text)
    if not args.no_readme:
        write_section(readme_section(data, text, argv or sys.argv[1:]), BEGIN, END, "Training step")
    drawn = ""
    if not args.no_plot:
        plot(data, args.out / "training.png")
        drawn = f"plot: {args.out / 'training.png'}, "
    print(f"\n{args.ranks} ranks, {time.monotonic() - start:.0f} s; {drawn}numbers: {raw}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), int(os.environ["MASTER_PORT"]), sys.argv[4],
                  json.loads(sys.argv[5]))
    else:
        sys.exit(main())
