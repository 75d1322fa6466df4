"""The step model (tinypaged/kernels/cuda/tools/step_model.py) re-calibrated on the card
(issue 45, part 6). Its assumptions are figures measured on an earlier card or taken
from the specification; gpu_check measures four of them again (the copy bandwidth, a
graph node, and here a dependent global load from HBM and one that hits L1), then
predicts every modeled figure
again with this card's values, beside the measured one and the first prediction: what
the model misses with its inputs right is the model's, the rest its inputs'.
"""
import numpy as np
from numba import cuda

from tinypaged.kernels.cuda.tools.step_model import ASSUMPTIONS, decode_step, predict

MODELED = {}  # figure name -> function(assumptions) -> the predicted value
LINE_WORDS = 32  # int32 words in a 128-byte line: one load a line


def modeled(name, predict_value):
    """The value the step model predicts for figure `name` with its own assumptions;
    kept to be predicted again with the card's (print_recalibrated)."""
    MODELED[name] = predict_value
    return predict_value(ASSUMPTIONS)


def decode_tokens_per_s(cfg, batch, context):
    """The step model's decode tokens/s for cfg's shapes (float16) as a function of its
    assumptions (calibration.modeled)."""
    kernels = decode_step(cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                          cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size,
                          cfg.vocab_size, batch, context=context)
    return lambda a: batch * 1e6 / predict(kernels, a)["step_us"]


@cuda.jit
def _chase(chain, steps, out):
    """One thread, `steps` loads, each at the index the one before it read."""
    j = 0
    for _ in range(steps):
        j = chain[j]
    out[0] = j


def load_chain(n_lines: int, rng) -> np.ndarray:
    """n_lines 128-byte lines as one cycle in random order: a line's first word holds
    the index of the next line's (every load a new line, no stride to prefetch)."""
    order = rng.permutation(n_lines)
    chain = np.zeros(n_lines * LINE_WORDS, np.int32)
    chain[order * LINE_WORDS] = np.roll(order, -1) * LINE_WORDS
    return chain


def round_trips(report, timed, costs, tiny=False):
    """Microseconds of one dependent global load from HBM (a 512 MB chain, ten times the
    L2; TLB misses included), from the L2 (4 MB) and from L1 (16 KB: after its first
    pass every load hits); the HBM one stands for the model's round_trip_us ("L2 or
    HBM, rounded up"), the L1 one for its l1_hit_us."""
    rng = np.random.default_rng(45)
    out = cuda.device_array(1, np.int32)
    for where, nbytes in (("HBM", 512 << 20), ("L2", 4 << 20), ("L1", 16 << 10)):
        nbytes = min(nbytes, 64 << 10) if tiny else nbytes
        chain = cuda.to_device(load_chain(nbytes // (4 * LINE_WORDS), rng))
        steps = 100 if tiny else 20_000

        def walk():
            _chase[1, 1](chain, steps, out)
        seconds = timed(walk, repeat=3) / steps
        costs[f"round_trip_{where}_s"] = seconds
        size = f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
        assumed = ASSUMPTIONS["l1_hit_us" if where == "L1" else "round_trip_us"]
        report(f"a dependent global load, {where} ({size} chain)", seconds * 1e6, "us",
               f"the step model assumes {assumed} us" + ("" if where == "L1" else " (L2 or HBM, rounded up)"))


def card_assumptions(costs) -> dict:
    """ASSUMPTIONS with this card's copy bandwidth, graph node, HBM round trip and L1
    hit; a figure that did not come out positive (the simulator's) keeps the model's."""
    measured = {"bandwidth_gbps": costs.get("copy_gbps", 0.0),
                "node_us": costs.get("node_s", 0.0) * 1e6,
                "round_trip_us": costs.get("round_trip_HBM_s", 0.0) * 1e6,
                "l1_hit_us": costs.get("round_trip_L1_s", 0.0) * 1e6}
    return dict(ASSUMPTIONS, **{k: v for k, v in measured.items() if v > 0})


def print_recalibrated(rows, costs) -> None:
    """The modeled figures predicted again with this card's assumptions, as a table."""
    a = card_assumptions(costs)
    changed = ", ".join(f"{k}={a[k]:.3g} (was {ASSUMPTIONS[k]})" for k in a if a[k] != ASSUMPTIONS[k])
    print(f"\nthe step model on this card's figures: {changed or 'none measured'}")
    print("| figure | measured | predicted | predicted on this card's figures | measured / that |")
    print("|---|---|---|---|---|")
    for name, value, _, _, predicted in rows:
        if name in MODELED:
            again = MODELED[name](a)
            print(f"| {name} | {value:.0f} | {predicted:.0f} | {again:.0f} | {value / again:.2f} |",
                  flush=True)
