"""The machine's matrix rate at a model's own shapes: the limit `dbert bench`, profile_sample and
train_mfu put achieved GFLOP/s against.

    best_time           the fastest of a few timed calls (synchronised on a GPU)
    matmul_peak         a large square F.linear's GFLOP/s
    model_shapes        a forward's matrix products as F.linear's (rows, in, out)
    linear_rate         one of them's GFLOP/s
    shape_rates         each of them, and the forward's products together: the limit of one batch
    side_by_side_rate   the same products as batches side by side, each on its share of the
                        threads (sampling/parallel.py): the limit of such a run
    fraction            achieved over rate
"""

from __future__ import annotations

import threading
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, device, reps: int, warmup: int = 1) -> float:
    """Fastest of `reps` timed calls (after `warmup` untimed ones), in seconds."""
    for _ in range(warmup):
        fn()
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of the best n x n x n matrix product, through F.linear (the kernels nn.Linear uses:
    for bf16 on a CPU torch.mm takes a much slower path than linear's oneDNN one)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, dtype)
    w = torch.randn(n, n, generator=g).to(device, dtype)
    with torch.inference_mode():
        sec = best_time(lambda: torch.nn.functional.linear(a, w), device, reps)
    return 2 * n**3 / sec / 1e9


def model_shapes(config, B: int, N: int, M: int) -> dict[str, tuple[int, int, int]]:
    """The matrix products of a forward on (B, N) tokens projecting M positions, as F.linear's
    (rows, in, out): the fused QKV, the attention output, the FFN up and down (every layer), the
    head's transform and its vocabulary projection (M rows)."""
    H, I, V = config.hidden_size, config.intermediate_size, config.vocab_size
    return {"qkv": (B * N, H, 3 * H), "attn out": (B * N, H, H), "ffn up": (B * N, H, I),
            "ffn down": (B * N, I, H), "head": (M, H, H), "vocab": (M, H, V)}


def linear_rate(rows: int, k: int, n: int, dtype: torch.dtype, device: torch.device, reps: int) -> float:
    """GFLOP/s of the best of `reps` F.linear calls (rows, k) x (n, k)^T + bias, the product and
    kernel nn.Linear runs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g).to(device, dtype)
    w = torch.randn(n, k, generator=g).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype)
    with torch.inference_mode():
        sec = best_time(lambda: torch.nn.functional.linear(x, w, b), device, reps)
    return 2 * rows * k * n / sec / 1e9


def _sig(x: float) -> float:
    """x to 4 significant digits: a tiny model's step of 4 ms keeps its precision (round(x, 3) lost 10%)."""
    return float(f"{x:.4g}")


def shape_rates(config, B: int, N: int, M: int, dtype: torch.dtype, device: torch.device, reps: int) -> dict:
    """F.linear's rate at each of the model's shapes (model_shapes) and the rate of the forward's
    matrix products together: their FLOPs over the sum of their times at those rates (each layer's
    products counted `layers` times). That combined rate is the limit a forward at (B, N, M) can
    reach on this machine in `dtype` with the current threads (attention's batched products and
    the elementwise work are not in it: they can only make a forward slower)."""
    shapes = model_shapes(config, B, N, M)
    rates = {name: linear_rate(*shape, dtype, device, reps) for name, shape in shapes.items()}
    flops = {name: 2 * r * k * n * (1 if name in ("head", "vocab") else config.num_hidden_layers)
             for name, (r, k, n) in shapes.items()}
    seconds = sum(flops[name] / (rates[name] * 1e9) for name in shapes)
    out = {name: _sig(rate) for name, rate in rates.items()}
    out["model"] = _sig(sum(flops.values()) / seconds / 1e9)
    return out


def side_by_side_rate(config, B: int, N: int, M: int, dtype: torch.dtype, device: torch.device, workers: int,
                      reps: int) -> float:
    """The rate of a forward's matrix products at (B, N, M) when its rows run as `workers` equal
    batches side by side, each in its own thread on its share of torch's threads (what
    sampling.parallel does): each thread runs its batch's products once per round (each layer's
    `layers` times), all threads at once; their FLOPs over the best round's wall time. With one
    worker this is shape_rates' "model" rate measured as one forward's products in a row."""
    from ..sampling.parallel import plan

    sizes = plan(B, B, workers)  # the rows of each batch, as sampling splits them
    shapes = [model_shapes(config, rows, N, M * rows // B) for rows in sizes]
    g = torch.Generator().manual_seed(0)
    work = []  # per worker: [(x, w, b, times)]
    for sh in shapes:
        work.append([(torch.randn(r, k, generator=g).to(device, dtype), torch.randn(n, k, generator=g).to(device, dtype),
                      torch.randn(n, generator=g).to(device, dtype), 1 if name in ("head", "vocab") else config.num_hidden_layers)
                     for name, (r, k, n) in sh.items()])
    flops = sum(2 * x.shape[0] * x.shape[1] * w.shape[0] * times for part in work for x, w, _, times in part)

    threads = torch.get_num_threads()
    each = max(1, threads // len(work))

    def products(part) -> None:
        with torch.inference_mode():
            for x, w, b, times in part:
                for _ in range(times):
                    torch.nn.functional.linear(x, w, b)

    def one_round() -> None:
        if len(work) == 1:
            products(work[0])
            return

        def go(part):
            torch.set_num_threads(each)
            products(part)
        ts = [threading.Thread(target=go, args=(part,)) for part in work]
        torch.set_num_threads(each)
        try:
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        finally:
            torch.set_num_threads(threads)

    return _sig(flops / best_time(one_round, device, reps) / 1e9)


def fraction(achieved_gflop_per_s: float, rate: float | None) -> float | None:
    """achieved / rate, both measured (None where the rate was not measured)."""
    return _sig(achieved_gflop_per_s / rate) if rate else None
