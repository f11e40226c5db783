"""Analytic profiles: per-layer FLOPs and bytes from a model spec, turned into times
on a `paraplan.core.Device` (for hardware we do not have).

Every layer is a list of kernels (`Op`) for the forward and for the backward pass:
matrix products (convolutions as implicit GEMMs) and element-wise ops. Combining:

- ``roofline``: each op takes max(flops / peak, (read + write) bytes / bandwidth);
- ``sum``: the DistIR cost model (docs/distir-cost-model.md): a product costs
  operand bytes / bandwidth + flops / peak (its output is not counted), an
  element-wise op costs 4 x numel / peak with no memory term.

Both add the device's launch overhead once per op. Closed forms (batch b, element
size e): a Linear (k -> n) on m rows is 2mkn FLOPs forward, reading e(mk + kn);
its backward is two products of 2mkn each (dx = dz W^T, dW = x^T dz). Attention counts
full (non-causal) score and value products; the first layer of a CNN computes no input
gradient (as measured); the MLP computes dx everywhere (as DistIR does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from paraplan.core import ConfigError, Device, LayerProfile, ModelProfile
from paraplan.profile.specs import GPTSpec, MLPSpec, ResNetSpec, Spec, spec_settings

Combine = Literal["roofline", "sum"]
COMBINES: tuple[str, ...] = ("roofline", "sum")
DTYPE_BYTES = {"float32": 4, "tf32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Op:
    """One kernel: FLOPs, bytes read and written, and elements of its first input."""

    kind: Literal["matmul", "elementwise"]
    flops: float
    read_bytes: float
    write_bytes: float
    numel: float


@dataclass(frozen=True)
class LayerOps:
    name: str
    fwd: tuple[Op, ...]
    bwd: tuple[Op, ...]
    activation_bytes: float  # output at this batch
    param_bytes: float

    @property
    def fwd_flops(self) -> float:
        return sum(op.flops for op in self.fwd)


def matmul(m: float, k: float, n: float, e: int) -> Op:
    """(m x k) @ (k x n)."""
    return Op("matmul", 2.0 * m * k * n, e * (m * k + k * n), e * m * n, m * k)


def elementwise(numel: float, e: int, inputs: int = 1, flops_per_element: float = 1.0) -> Op:
    return Op("elementwise", flops_per_element * numel, e * inputs * numel, e * numel, numel)


def linear_ops(m: float, k: float, n: float, e: int, bias: bool,
               input_grad: bool = True) -> tuple[list[Op], list[Op]]:
    """A Linear layer (k -> n) on m rows: forward and backward kernels."""
    fwd = [matmul(m, k, n, e)]
    bwd = [matmul(m, n, k, e)] if input_grad else []  # dx = dz (m x n) @ W^T (n x k)
    bwd.append(matmul(k, m, n, e))  # dW = x^T (k x m) @ dz (m x n)
    if bias:
        fwd.append(elementwise(m * n, e, inputs=1))
        bwd.append(Op("elementwise", m * n, e * m * n, e * n, m * n))  # column sums
    return fwd, bwd


def conv_ops(b: float, c_in: int, c_out: int, kernel: int, h_out: int, w_out: int, e: int,
             input_grad: bool = True) -> tuple[list[Op], list[Op]]:
    """A convolution as an implicit GEMM: M = b h_out w_out, K = c_in k^2, N = c_out."""
    m, k, n = b * h_out * w_out, c_in * kernel * kernel, c_out
    return linear_ops(m, k, n, e, bias=False, input_grad=input_grad)


def _pointwise(numel: float, e: int, fwd_inputs: int = 1, flops_per_element: float = 1.0) -> tuple[Op, Op]:
    """An element-wise op and its backward (reads the gradient and the saved input)."""
    return (elementwise(numel, e, fwd_inputs, flops_per_element),
            elementwise(numel, e, fwd_inputs + 1, flops_per_element))


def mlp_ops(spec: MLPSpec, batch: float, e: int, include_loss: bool = False) -> list[LayerOps]:
    """`include_loss` adds DistIR's Loss (forward) and LossGrad (backward) to the last layer."""
    out = []
    for i, (d_in, d_out) in enumerate(spec.dims()):
        fwd, bwd = linear_ops(batch, d_in, d_out, e, spec.bias)
        relu_f, relu_b = _pointwise(batch * d_out, e)
        fwd.append(relu_f)
        bwd.insert(0, relu_b)
        if include_loss and i == spec.num_layers - 1:
            fwd.append(elementwise(batch * d_out, e, inputs=2))
            fwd.append(elementwise(batch * d_out, e, inputs=2))  # DistIR emits LossGrad here
        params = e * (d_in * d_out + (d_out if spec.bias else 0))
        out.append(LayerOps(f"linear{i}", tuple(fwd), tuple(bwd), e * batch * d_out, params))
    return out


def gpt_ops(spec: GPTSpec, batch: float, e: int) -> list[LayerOps]:
    h, s, v, a = spec.hidden_size, spec.seq_length, spec.vocab_size, spec.num_attention_heads
    n = batch * s  # tokens
    layers = []
    # embedding: gather + position add; backward: scatter-add into both tables
    emb_f = (elementwise(n * h, e, inputs=2),)
    emb_b = (elementwise(n * h, e, inputs=1), elementwise(n * h, e, inputs=1))
    layers.append(LayerOps("embedding", emb_f, emb_b, e * n * h, e * (v * h + s * h)))
    for i in range(spec.num_layers):
        fwd: list[Op] = []
        bwd: list[Op] = []

        def add_linear(k: int, nn: int, fwd=fwd, bwd=bwd) -> None:
            f, b = linear_ops(n, k, nn, e, bias=True)
            fwd.extend(f)
            bwd.extend(b)

        def add_pointwise(numel: float, inputs: int = 1, fpe: float = 1.0, fwd=fwd, bwd=bwd) -> None:
            f, b = _pointwise(numel, e, inputs, fpe)
            fwd.append(f)
            bwd.append(b)

        add_pointwise(n * h, fpe=5.0)  # ln1
        add_linear(h, 3 * h)  # qkv
        # per head: scores (s x d) @ (d x s), then probs (s x s) @ v (s x d); batch*heads of them
        heads_n = batch * a
        d = h // a
        for op in (matmul(s, d, s, e), matmul(s, s, d, e)):
            fwd.append(_scaled(op, heads_n))
            bwd.extend((_scaled(op, heads_n), _scaled(op, heads_n)))
        add_pointwise(heads_n * s * s, fpe=5.0)  # softmax
        add_linear(h, h)  # proj
        add_pointwise(n * h, inputs=2)  # residual
        add_pointwise(n * h, fpe=5.0)  # ln2
        add_linear(h, 4 * h)  # fc1
        add_pointwise(n * 4 * h, fpe=8.0)  # gelu
        add_linear(4 * h, h)  # fc2
        add_pointwise(n * h, inputs=2)  # residual
        params = e * (12 * h * h + 13 * h)
        layers.append(LayerOps(f"block{i}", tuple(fwd), tuple(bwd), e * n * h, params))
    ln_f, ln_b = _pointwise(n * h, e, flops_per_element=5.0)
    f, b = linear_ops(n, h, v, e, bias=False)
    layers.append(LayerOps("head", (ln_f, *f), (*b, ln_b), e * n * v, e * (v * h + 2 * h)))
    return layers


def _scaled(op: Op, times: float) -> Op:
    return Op(op.kind, op.flops * times, op.read_bytes * times, op.write_bytes * times, op.numel * times)


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def resnet_ops(spec: ResNetSpec, batch: float, e: int) -> list[LayerOps]:
    layers: list[LayerOps] = []
    size = _conv_out(spec.image_size, 7, 2, 3)
    fwd, bwd = conv_ops(batch, spec.in_channels, spec.width, 7, size, size, e, input_grad=False)
    for numel in (batch * spec.width * size * size,) * 2:  # bn, relu
        pf, pb = _pointwise(numel, e)
        fwd.append(pf)
        bwd.insert(0, pb)
    pooled = _conv_out(size, 3, 2, 1)
    pf, pb = _pointwise(batch * spec.width * size * size, e)  # max-pool reads the full map
    fwd.append(pf)
    bwd.insert(0, pb)
    size = pooled
    layers.append(LayerOps("stem", tuple(fwd), tuple(bwd), e * batch * spec.width * size * size,
                           e * (spec.in_channels * spec.width * 49 + 2 * spec.width)))
    block = 0
    for stage, count in enumerate(spec.blocks):
        for j in range(count):
            c_in, mid, c_out, stride = spec.stage_shapes()[block]
            block += 1
            out_size = _conv_out(size, 3, stride, 1)
            fwd, bwd = [], []
            convs = [(c_in, mid, 1, size), (mid, mid, 3, out_size), (mid, c_out, 1, out_size)]
            params = 0.0
            for ci, co, k, hw in convs:
                f, b = conv_ops(batch, ci, co, k, hw, hw, e)
                fwd.extend(f)
                bwd.extend(b)
                for _ in range(2):  # bn (+ relu; the third conv's relu comes after the add)
                    pf, pb = _pointwise(batch * co * hw * hw, e)
                    fwd.append(pf)
                    bwd.append(pb)
                params += e * (ci * co * k * k + 2 * co)
            if stride != 1 or c_in != c_out:
                f, b = conv_ops(batch, c_in, c_out, 1, out_size, out_size, e)
                pf, pb = _pointwise(batch * c_out * out_size * out_size, e)
                fwd.extend([*f, pf])
                bwd.extend([*b, pb])
                params += e * (c_in * c_out + 2 * c_out)
            pf, pb = _pointwise(batch * c_out * out_size * out_size, e, fwd_inputs=2)  # residual add
            fwd.append(pf)
            bwd.append(pb)
            size = out_size
            layers.append(LayerOps(f"stage{stage + 1}.block{j}", tuple(fwd), tuple(bwd),
                                   e * batch * c_out * size * size, params))
    channels = spec.stage_shapes()[-1][2]
    pool_f, pool_b = _pointwise(batch * channels * size * size, e)
    f, b = linear_ops(batch, channels, spec.num_classes, e, bias=True)
    layers.append(LayerOps("head", (pool_f, *f), (*b, pool_b), e * batch * spec.num_classes,
                           e * (channels * spec.num_classes + spec.num_classes)))
    return layers


def model_ops(spec: Spec, batch: float, dtype_bytes: int = 4, include_loss: bool = False) -> list[LayerOps]:
    """The kernels of every layer of `spec` at `batch` samples."""
    if isinstance(spec, MLPSpec):
        return mlp_ops(spec, batch, dtype_bytes, include_loss)
    if isinstance(spec, GPTSpec):
        return gpt_ops(spec, batch, dtype_bytes)
    return resnet_ops(spec, batch, dtype_bytes)


def op_time_s(op: Op, device: Device, combine: Combine, peak_flops: float | None = None) -> float:
    peak = peak_flops if peak_flops is not None else device.peak_flops
    if combine == "roofline":
        compute = max(op.flops / peak, (op.read_bytes + op.write_bytes) / device.mem_bandwidth_Bps)
    elif combine == "sum":
        if op.kind == "matmul":
            compute = op.read_bytes / device.mem_bandwidth_Bps + op.flops / peak
        else:
            compute = 4.0 * op.numel / peak  # DistIR's element-wise cost, literally
    else:
        raise ConfigError("combine", f"unknown value '{combine}'; expected one of {', '.join(COMBINES)}")
    return compute + device.launch_overhead_s


def analytic_profile(spec: Spec, batch_size: int, device: Device, combine: Combine = "roofline",
                     dtype: str = "float32", include_loss: bool = False, name: str | None = None,
                     peak_flops: float | None = None) -> ModelProfile:
    """A `ModelProfile` at `batch_size` on `device`: every time is linear in the batch
    except the launch overheads, which become `fwd_fixed_s` / `bwd_fixed_s`.

    `peak_flops` overrides the device's peak for `dtype` (`Device.peak_flops_for`)."""
    if dtype not in DTYPE_BYTES:
        raise ConfigError("dtype", f"unknown value '{dtype}'; expected one of {', '.join(DTYPE_BYTES)}")
    if combine not in COMBINES:
        raise ConfigError("combine", f"unknown value '{combine}'; expected one of {', '.join(COMBINES)}")
    peak = peak_flops if peak_flops is not None else device.peak_flops_for(dtype)
    e = DTYPE_BYTES[dtype]
    layers = []
    for lo in model_ops(spec, batch_size, e, include_loss):
        fwd = sum(op_time_s(op, device, combine, peak) for op in lo.fwd)
        bwd = sum(op_time_s(op, device, combine, peak) for op in lo.bwd)
        layers.append(LayerProfile(
            name=lo.name, fwd_s=fwd, bwd_s=bwd, activation_bytes=lo.activation_bytes,
            param_bytes=lo.param_bytes, fwd_fixed_s=len(lo.fwd) * device.launch_overhead_s,
            bwd_fixed_s=len(lo.bwd) * device.launch_overhead_s, flops=lo.fwd_flops,
        ))
    meta = {
        "method": f"analytic-{combine}", "device": device.name, "dtype": dtype,
        "peak_flops": peak, "mem_bandwidth_Bps": device.mem_bandwidth_Bps,
        "launch_overhead_s": device.launch_overhead_s, "model_settings": spec_settings(spec),
    }
    return ModelProfile(name or type(spec).__name__.removesuffix("Spec").lower(), batch_size,
                        tuple(layers), meta=meta)
