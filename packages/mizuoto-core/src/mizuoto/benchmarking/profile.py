"""``mizuoto bench --profile``: where a request's time goes, component by component, against
the memory bandwidth measured on this machine (the roofline of a weight-streaming decoder).

An engine names its components with ``profile_components()`` (a name -> the modules whose
forward calls make it up, e.g. VoxCPM's ``base_lm``, ``dit``, ``vae``; F5's ``transformer``,
``vocoder``). Each module's calls are timed by forward hooks (wall clock; on CUDA the device is
synchronised at each hook, which slows the run: the split is what it is for, not the total),
and every call is counted as reading all of the module's weights once: ``weights_gb_s`` is
that traffic over the component's time, ``roofline`` its fraction of the measured bandwidth.
What no component covers (Python, sampling glue, the text path) is ``other``.

Reading the weights is not the only floor: a call whose linear layers and convolutions take
many rows at once (a guided DiT evaluation's ten) can need more multiply-adds than the CPU does
in that time. So the multiply-adds of every call are counted too, per layer, and each call's
floor is the larger of its weight traffic at the measured bandwidth and its multiply-adds at a
rate. ``mizuoto bench`` gives the rates of :mod:`mizuoto.benchmarking.kernels`: each component
says which kernels its layers ran and is measured against three floors, its weights at the
bandwidth (``roofline``), its multiply-adds at the rate of the kernels that ran
(``of_kernel_floor``), and at the best rate the CPU reaches in each layer's dtype (``of_floor``,
the strict one: a slow kernel cannot look near it); ``floor_s`` for the request. One rate for
every layer (``compute_gmac_s``) is still taken.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mizuoto.benchmarking.kernels import KernelRates

#: Bytes copied per bandwidth probe: far larger than any L3 cache.
BANDWIDTH_BYTES = 256 << 20


def measure_bandwidth(repeats: int = 5) -> float:
    """This machine's memory bandwidth in GB/s as torch's threads see it: the fastest of
    ``repeats`` copies of a ``BANDWIDTH_BYTES`` tensor (read + write counted)."""
    import torch

    source = torch.ones(BANDWIDTH_BYTES // 4)
    target = torch.empty_like(source)
    target.copy_(source)  # pages touched before timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * BANDWIDTH_BYTES / best / 1e9


def measure_read_rate(repeats: int = 5) -> float:
    """How fast this machine's threads *read* memory, in GB/s: the fastest of ``repeats`` sums
    of a ``BANDWIDTH_BYTES`` float32 tensor. A weight-streaming decode step only reads its
    weights, but :func:`measure_bandwidth`'s copy counts a write too, and the two rates need
    not agree (docs/performance.md, "Why a 1-row LM step reads its weights at about 14 GB/s"),
    so the profile gives both."""
    import torch

    source = torch.ones(BANDWIDTH_BYTES // 4)
    source.sum()  # pages touched before timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        source.sum()
        best = min(best, time.perf_counter() - start)
    return BANDWIDTH_BYTES / best / 1e9


#: Methods timed besides ``forward`` where a module has them (a decode step is often a method
#: of its own: VoxCPM's ``MiniCPM4.step``, its VAE's ``decode``).
TIMED_METHODS = ("step", "step_rows", "decode", "decode_tail")


def _weight_bytes(module) -> int:
    """The weights one call reads: all parameters but embedding tables (a call gathers a few
    rows of those), and the packed weights of quantized layers (an int8 fast profile's
    dynamic linears hold theirs outside ``parameters()``)."""
    from torch import nn

    tables = {id(p) for m in module.modules() if isinstance(m, nn.Embedding)
              for p in m.parameters()}
    plain = sum(p.numel() * p.element_size() for p in module.parameters()
                if id(p) not in tables)
    return plain + sum(_packed_bytes(m) for m in module.modules())


def _packed_bytes(module) -> int:
    own = getattr(module, "packed_weight_bytes", None)  # mizuoto.runtime.packed_int8's
    if isinstance(own, int):
        return own
    packed = getattr(module, "_packed_params", None)
    unpack = getattr(packed, "_weight_bias", None)
    if unpack is None:
        return 0
    weight, bias = unpack()
    return sum(t.numel() * t.element_size() for t in (weight, bias) if t is not None)


class _Clock:
    def __init__(self, synchronize) -> None:
        self.synchronize = synchronize
        self.seconds = 0.0
        self.calls = 0
        self.bytes = 0
        self.weight_bytes = 0
        self._depth = 0  # a timed method calling forward (or another) counts once
        self._started = 0.0
        self.opened = time.perf_counter()  # when the clocks were set (the request's start)
        self.first_seconds: float | None = None  # the first call (an LM's: the prefill)
        self.first_end: float | None = None  # when the first call ended, from ``opened``
        self.macs = 0  # multiply-adds of the call under way
        self.per_call: list[tuple[int, int]] = []  # (weight bytes, multiply-adds) per call
        self.layers: list = []  # the counted layers, in the order of ``per_call_layers``
        self._index: dict[int, int] = {}  # id(layer) -> its position in ``layers``
        self._layer_macs: dict[int, int] = {}  # the call under way's, by layer position
        self.per_call_layers: list[dict[int, int]] = []  # each call's multiply-adds by layer

    def count(self, module, inputs, output) -> None:
        """A linear layer's or convolution's forward hook: its multiply-adds, within a call."""
        if self._depth > 0:
            macs = _multiply_adds(module, inputs, output)
            self.macs += macs
            if macs:
                index = self._index.setdefault(id(module), len(self.layers))
                if index == len(self.layers):
                    self.layers.append(module)
                self._layer_macs[index] = self._layer_macs.get(index, 0) + macs

    def start(self, *_) -> None:
        self._depth += 1
        if self._depth == 1:
            self.synchronize()
            self.macs = 0
            self._layer_macs = {}
            self._started = time.perf_counter()

    def stop(self, *_) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.synchronize()
            ended = time.perf_counter()
            self.seconds += ended - self._started
            if self.first_seconds is None:
                self.first_seconds, self.first_end = ended - self._started, ended - self.opened
            self.calls += 1
            self.bytes += self.weight_bytes
            self.per_call.append((self.weight_bytes, self.macs))
            self.per_call_layers.append(self._layer_macs)

    def wrap(self, method):
        def timed(*args, **kwargs):
            self.start()
            try:
                return method(*args, **kwargs)
            finally:
                self.stop()
        return timed


def _multiply_adds(module, inputs, output) -> int:
    """One call's multiply-adds of a linear layer (rows × in × out) or a 1-d convolution
    (output positions × the inputs each one sums), 0 for anything else."""
    from torch import nn

    if not inputs or not hasattr(output, "shape"):
        return 0
    x = inputs[0]
    if isinstance(module, nn.Conv1d):
        kernel = module.kernel_size[0] * module.in_channels // module.groups
        return output.numel() * kernel
    if isinstance(module, nn.ConvTranspose1d):
        return x.numel() * module.kernel_size[0] * module.out_channels // module.groups
    features = getattr(module, "in_features", None)
    if isinstance(features, int) and isinstance(getattr(module, "out_features", None), int):
        return x.numel() // features * features * module.out_features
    return 0


def _counted_layers(module):
    """The layers under ``module`` whose multiply-adds are counted: linear layers (plain,
    prepacked or int8: anything with integer ``in_features`` and ``out_features`` holding no
    such layer itself) and 1-d convolutions."""
    from torch import nn

    for layer in module.modules():
        if isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d)) or (
                _is_linear(layer) and not any(_is_linear(sub) for sub in layer.modules()
                                              if sub is not layer)):
            yield layer


def _is_linear(layer) -> bool:
    return (isinstance(getattr(layer, "in_features", None), int)
            and isinstance(getattr(layer, "out_features", None), int))


@contextmanager
def component_clocks(components: Mapping[str, Sequence[Any]]) -> Iterator[dict[str, list]]:
    """Hooks timing every forward call of each component's modules for the block; yields
    name -> its clocks (read them after the block with :func:`split`)."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    clocks: dict[str, list] = {}
    handles, wrapped = [], []
    for name, modules in components.items():
        clocks[name] = []
        for module in modules:
            clock = _Clock(synchronize)
            clock.weight_bytes = _weight_bytes(module)
            handles.append(module.register_forward_pre_hook(clock.start))
            # counting first: a component that is one linear layer (a stop head) counts its
            # own multiply-adds before its call is closed
            for layer in _counted_layers(module):
                handles.append(layer.register_forward_hook(clock.count))
            handles.append(module.register_forward_hook(clock.stop))
            for method in TIMED_METHODS:
                if callable(getattr(module, method, None)) and method not in vars(module):
                    setattr(module, method, clock.wrap(getattr(module, method)))
                    wrapped.append((module, method))
            clocks[name].append(clock)
    try:
        yield clocks
    finally:
        for handle in handles:
            handle.remove()
        for module, method in wrapped:
            delattr(module, method)


def split(clocks: Mapping[str, list], total_s: float, bandwidth_gb_s: float,
          per: str | None = None, compute_gmac_s: float | None = None,
          rates: KernelRates | None = None, read_gb_s: float | None = None) -> dict[str, Any]:
    """The profile of one request: per component its milliseconds, calls, weight traffic
    (GB/s) and fraction of ``bandwidth_gb_s``; ``other`` the rest of ``total_s``. ``per``: the
    component whose call count is the unit (VoxCPM's ``stop_head``: one call per patch), to
    also give milliseconds per unit, and when the first unit was done: for VoxCPM the first
    patch sampled, the prefill and one patch, what the first audio waits for besides its
    decode). Each component's ``first_call_ms`` is its first module's first call (an LM's
    prefill). With ``rates`` (:func:`~mizuoto.benchmarking.kernels.measure_kernel_rates`):
    each component's ``kernels`` (name -> layers that ran it) and its floors at those
    kernels' rates (``kernel_floor_ms``) and at the CPU's best rate per dtype (``floor_ms``,
    in place of one ``compute_gmac_s`` for all). With ``read_gb_s`` (:func:`measure_read_rate`):
    each component's weight traffic as a fraction of that read rate too (``of_read_rate``)."""
    from mizuoto.benchmarking.kernels import kernel_counts

    # a component's calls are its first module's (the LM itself, not its projections)
    units = clocks[per][0].calls if clocks.get(per) else 1
    components: dict[str, Any] = {}
    covered = 0.0
    for name, group in clocks.items():
        seconds = sum(c.seconds for c in group)
        traffic = sum(c.bytes for c in group)
        covered += seconds
        rate = traffic / seconds / 1e9 if seconds else None
        floor = _floor_s(group, bandwidth_gb_s, compute_gmac_s)
        kernel_floor = None
        if rates is not None:
            floor = _rated_floor_s(group, bandwidth_gb_s, lambda kernel, dtype: rates.best(dtype))
            kernel_floor = _rated_floor_s(group, bandwidth_gb_s,
                                          lambda kernel, dtype: rates.kernel(kernel))
        components[name] = {
            "ms": seconds * 1e3, "calls": group[0].calls if group else 0,
            "ms_per_unit": seconds * 1e3 / units if units else None,
            "weights_mb_per_unit": traffic / units / 1e6 if units else None,
            "weights_gb_s": rate,
            "roofline": rate / bandwidth_gb_s if rate and bandwidth_gb_s else None,
            "of_read_rate": rate / read_gb_s if rate and read_gb_s else None,
            "gmacs_per_unit": (sum(m for c in group for _, m in c.per_call) / units / 1e9
                               if units else None),
            "floor_ms": floor * 1e3 if floor is not None else None,
            "of_floor": floor / seconds if floor is not None and seconds else None,
            "first_call_ms": (group[0].first_seconds * 1e3
                              if group and group[0].first_seconds is not None else None)}
        if rates is not None:
            components[name].update({
                "kernels": kernel_counts(layer for c in group for layer in c.layers),
                "kernel_floor_ms": kernel_floor * 1e3 if kernel_floor is not None else None,
                "of_kernel_floor": (kernel_floor / seconds
                                    if kernel_floor is not None and seconds else None)})
    rest = max(total_s - covered, 0.0)
    components["other"] = {"ms": rest * 1e3, "calls": None,
                           "ms_per_unit": rest * 1e3 / units if units else None,
                           "weights_mb_per_unit": None, "weights_gb_s": None, "roofline": None,
                           "of_read_rate": None,
                           "gmacs_per_unit": None, "floor_ms": None, "of_floor": None,
                           "first_call_ms": None}
    if rates is not None:
        components["other"].update(kernels={}, kernel_floor_ms=None, of_kernel_floor=None)
    first = clocks[per][0] if clocks.get(per) else None
    traffic = sum(c.bytes for group in clocks.values() for c in group)
    bound_s = traffic / (bandwidth_gb_s * 1e9) if bandwidth_gb_s else None
    floors = [components[name]["floor_ms"] for name in clocks]
    floor_s = (sum(floors) / 1e3 if (compute_gmac_s or rates) and floors
               and None not in floors else None)
    kernel_floors = [components[name].get("kernel_floor_ms") for name in clocks]
    kernel_floor_s = (sum(kernel_floors) / 1e3 if rates and kernel_floors
                      and None not in kernel_floors else None)
    rated = {} if rates is None else {
        "kernel_rates_gmac_s": dict(rates.kernels),
        "cpu_rates": {dtype: {"gmac_s": rate, "kernel": kernel}
                      for dtype, (rate, kernel) in sorted(rates.cpu.items())},
        "kernel_floor_s": kernel_floor_s,
        "of_kernel_floor": kernel_floor_s / total_s if kernel_floor_s and total_s else None}
    return {**rated, "bandwidth_gb_s": bandwidth_gb_s, "read_gb_s": read_gb_s,
            "compute_gmac_s": compute_gmac_s,
            "request_s": total_s, "unit": per or "request",
            "units": units, "components": components,
            "first_unit_s": first.first_end if first is not None else None,
            # the request could not take less than reading its weights once per call
            "bandwidth_bound_s": bound_s,
            "roofline": bound_s / total_s if bound_s and total_s else None,
            # ... nor less than each call's larger floor, traffic or multiply-adds
            "floor_s": floor_s,
            "of_floor": floor_s / total_s if floor_s and total_s else None}


def _floor_s(group, bandwidth_gb_s: float, compute_gmac_s: float | None) -> float | None:
    if not compute_gmac_s or not bandwidth_gb_s:
        return None
    return sum(max(traffic / (bandwidth_gb_s * 1e9), macs / (compute_gmac_s * 1e9))
               for clock in group for traffic, macs in clock.per_call)


def _rated_floor_s(group, bandwidth_gb_s: float, rate_of) -> float | None:
    """Each call's floor, its weights at the bandwidth or each layer's multiply-adds at
    ``rate_of(kernel, dtype)`` (GMAC/s; ``None``: unknown, and so is the floor)."""
    from mizuoto.benchmarking.kernels import layer_kernel

    if not bandwidth_gb_s:
        return None
    total = 0.0
    for clock in group:
        layer_rates = []
        for layer in clock.layers:
            rate = rate_of(*layer_kernel(layer))
            if not rate:
                return None
            layer_rates.append(rate)
        for (traffic, _), macs in zip(clock.per_call, clock.per_call_layers, strict=True):
            compute = sum(m / (layer_rates[i] * 1e9) for i, m in macs.items())
            total += max(traffic / (bandwidth_gb_s * 1e9), compute)
    return total


def profile_table(profile: Mapping[str, Any]) -> str:
    """The split as text: one row per component."""
    unit = profile["unit"]
    lines = [f"profile: {profile['request_s']:.2f} s, {profile['units'] or '-'} {unit} calls; "
             f"measured bandwidth {profile['bandwidth_gb_s']:.1f} GB/s"
             + (f" (copy; reading alone {profile['read_gb_s']:.1f} GB/s)"
                if profile.get("read_gb_s") else "") + "; bandwidth bound "
             f"{_num(profile['bandwidth_bound_s'], 2)} s ({_pct(profile['roofline'])} of it)"
             + (f"; first {unit} done after {profile['first_unit_s']:.2f} s"
                if profile.get("first_unit_s") is not None else "")]
    rated = "cpu_rates" in profile
    if rated:
        lines.append("CPU rate per dtype (the best large product torch runs here): " + "; ".join(
            f"{dtype} {row['gmac_s']:.1f} GMAC/s ({row['kernel']})"
            for dtype, row in profile["cpu_rates"].items()))
        lines.append("kernel rates (large products): " + "; ".join(
            f"{kernel} {rate:.1f}" for kernel, rate in profile["kernel_rates_gmac_s"].items())
            + " GMAC/s")
        lines.append(f"floors, each call's weights at the bandwidth or its multiply-adds at a "
                     f"rate: at the kernels' own {_num(profile['kernel_floor_s'], 2)} s "
                     f"({_pct(profile['of_kernel_floor'])} of it), at the CPU's "
                     f"{_num(profile['floor_s'], 2)} s ({_pct(profile['of_floor'])} of it)")
    elif profile.get("floor_s") is not None:
        lines.append(f"measured compute {profile['compute_gmac_s']:.1f} GMAC/s; each call's "
                     f"floor, weights at the bandwidth or multiply-adds at that rate: "
                     f"{profile['floor_s']:.2f} s ({_pct(profile['of_floor'])} of it)")
    read = bool(profile.get("read_gb_s"))
    lines.append(f"{'component':<12} {'ms':>9} {'calls':>6} {'ms/' + unit:>12} "
                 f"{'MB/' + unit:>12} {'GB/s':>6} {'roofline':>8} "
                 + (f"{'of read':>7} " if read else "") + f"{'GMAC/' + unit:>11} "
                 + (f"{'of kernel fl':>12} " if rated else "")
                 + f"{'floor ms':>9} {'of floor':>8} {'1st call ms':>11}")
    for name, row in profile["components"].items():
        lines.append(f"{name:<12} {row['ms']:>9.1f} {row['calls'] or '-':>6} "
                     f"{_num(row['ms_per_unit'], 1):>12} {_num(row['weights_mb_per_unit'], 1):>12} "
                     f"{_num(row['weights_gb_s'], 1):>6} {_pct(row['roofline']):>8} "
                     + (f"{_pct(row.get('of_read_rate')):>7} " if read else "")
                     + f"{_num(row.get('gmacs_per_unit'), 2):>11} "
                     + (f"{_pct(row.get('of_kernel_floor')):>12} " if rated else "")
                     + f"{_num(row.get('floor_ms'), 1):>9} {_pct(row.get('of_floor')):>8} "
                     f"{_num(row.get('first_call_ms'), 1):>11}")
    eager = profile.get("eager_for_hooks")
    if eager:
        lines.append("timed eager, traced in a plain request (a trace runs no hook, and these "
                     "clocks are hooks): " + ", ".join(f"{name} x{count}"
                                                       for name, count in sorted(eager.items())))
    if rated:  # roofline: of the bandwidth floor; floor: the CPU's, per dtype
        lines.append("kernels that ran:")
        lines.extend(f"  {name}: " + ", ".join(f"{kernel} x{count}"
                                               for kernel, count in row["kernels"].items())
                     for name, row in profile["components"].items() if row.get("kernels"))
    return "\n".join(lines)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"
