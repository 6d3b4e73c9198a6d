"""A small MLIR text builder: globals, deduplicated helper functions, and an entry body.

Owns: `ModuleEmitter` (parameter globals named by GGUF tensor, or by the .irpa copy of one that
IREE could not map in place, `copies`; private helper functions rendered once from `mlir/`
templates, SSA names) and the op helpers that call those templates with the
right placeholders for a static (decode, T = 1) or dynamic (prefill, T = ?) token dimension. On
the CPU the argmax, RMSNorm (alone or with the residual add before it) and q's RoPE are
hand-written dispatches over a dynamic row count (`_rows_call`, which casts a one-token body's
[1, n] to [?, n] and the result back). A decode batch's stacked dot8 matmul writes its parts
part-major (`_part_major`: each part a contiguous slice, not a strided copy). On a Vulkan GPU
target with integer dot products a decode body's matmuls take zinc.compiler.dp4's kernels, each
activation rounded to int8 once for all the matmuls that read it (`_dp4_quantized`). On the CPU a
decode body's next dot8 matmul takes on the K/V prefetch set in `Body.kv_prefetch`
(zinc.compiler.kv_prefetch) and gets the slab, the rows' slots and lengths as operands. RoPE's
cos/sin table is computed once per step; with Llama 3's per-pair frequency factors its
frequencies are a constant (`rope_freqs`), so models without them keep the same MLIR.
Imports: zinc.artifact (COPY_PLANE), zinc.compiler.kernels, zinc.compiler.tiled and
zinc.compiler.dot8 (the repacked CPU weight layouts), zinc.compiler.dp4 (the Vulkan decode
matmuls with integer dot products), zinc.compiler.gemm,
zinc.compiler.attention_prefill, zinc.compiler.kv_prefetch, zinc.mlir templates.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any, Protocol

import numpy as np

from zinc.artifact import COPY_PLANE
from zinc.compiler import dot8, dot8_layout, dp4, tiled
from zinc.compiler.attention_prefill import render_prefill_attention
from zinc.compiler.gemm import dequant_name, gemm_name, render_dequant, render_gemm
from zinc.compiler.kernels import (
    QuantType,
    gather_name,
    matmul_name,
    render_gather,
    render_matmul,
    t_dims,
    template,
)
from zinc.compiler.kv_prefetch import KvPrefetch


class WeightLayout(Protocol):
    """A repacked CPU weight layout and its kernels (the modules `tiled` and `dot8`)."""

    def plane_types(self, q: QuantType, n: int, k: int) -> dict[str, str]: ...
    def repack(self, q: QuantType, raw: Any, n: int, k: int) -> dict[str, np.ndarray[Any, Any]]: ...
    def decode_name(self, q: QuantType, n: int, k: int, rows: int = 0) -> str: ...
    def render_decode(self, q: QuantType, n: int, k: int, rows: int = 0) -> str: ...
    def prefill_name(self, q: QuantType, n: int, k: int) -> str: ...
    def render_prefill(self, q: QuantType, n: int, k: int) -> str: ...


LAYOUTS: dict[str, WeightLayout] = {"tiled": tiled, "dot8": dot8}


def f32_const(x: float) -> str:
    return f"{x:.9e}"


def _argmax_indices(blocks: int, block: int, iotas: bool) -> dict[str, str]:
    """mlir/argmax.mlir's block and element numbers: `linalg.index`, or on named GPU targets i32
    iota constants read as inputs (zinc.compiler.targets.index_inputs)."""
    if not iotas:
        lines = ["%n = linalg.index 1 : index", "%b = linalg.index 2 : index",
                 "%ni = arith.index_cast %n : index to i32", "%bi = arith.index_cast %b : index to i32"]  # fmt: skip
        return {"IOTAS": "", "IOTA_MAPS": "", "IOTA_INS": "", "IOTA_TYPES": "", "IOTA_ARGS": "",
                "INDICES": "".join(f"      {line}\n" for line in lines)}  # fmt: skip
    consts = "".join(
        f"  %iota{n} = arith.constant dense<[{', '.join(map(str, range(n)))}]> : tensor<{n}xi32>\n" for n in sorted({blocks, block})
    )
    return {
        "IOTAS": consts, "IOTA_MAPS": "affine_map<(t, n, b) -> (n)>, affine_map<(t, n, b) -> (b)>, ",
        "IOTA_INS": f", %iota{blocks}, %iota{block}", "IOTA_TYPES": f", tensor<{blocks}xi32>, tensor<{block}xi32>",
        "IOTA_ARGS": "%ni: i32, %bi: i32, ", "INDICES": "",
    }  # fmt: skip


class ModuleEmitter:
    """Collects the text of one MLIR module."""

    def __init__(
        self,
        tiled: bool = False,
        dot8: bool = False,
        index_inputs: bool = False,
        copies: frozenset[str] = frozenset(),
        dp4_subgroup: int = 0,
        shared_layers: bool = False,
    ) -> None:
        self.tiled = tiled  # bind supported matmul weights as repacked planes (the CPU fast path)
        self.dot8 = dot8  # and prefer the integer dot-product layout where it applies (AVX2)
        # the forms for IREE's subgroup pipelines: iota inputs for loop indices (Vulkan GPU
        # targets: zinc.compiler.targets.index_inputs)
        self.index_inputs = index_inputs
        # decode matmuls (one token, or a decode batch's rows) with integer dot products on a
        # Vulkan GPU target, for subgroups this wide (zinc.compiler.dp4); 0: the linalg matmuls
        self.dp4_subgroup = dp4_subgroup
        # a layer's number reaches the KV slab's kernels as a push constant (Body.opaque_index)
        self.shared_layers = shared_layers
        # the KV slab's type (compiler/paged.py): f16 on the CPU, on Vulkan f16 two to an i32 word
        self.kv_dtype = "f16" if tiled else "f16x2"
        # repacked weight -> (GGUF tensors whose rows it stacks, type, n, k, layout), for the .irpa
        self.repacked: dict[str, tuple[tuple[str, ...], QuantType, int, int, str]] = {}
        # GGUF tensors to bind from an aligned copy of their bytes in the .irpa (`param`); those bound so
        self.copies = copies
        self.copied: set[str] = set()
        self.globals: dict[str, str] = {}  # symbol -> declaration
        self.funcs: dict[str, str] = {}  # symbol -> private helper text
        self.entries: list[str] = []

    def param(self, gguf_name: str, mlir_type: str) -> str:
        """A weight bound at run time from the parameter archive; returns its global symbol. A
        tensor in `copies` is bound from its copy in the .irpa (`<tensor>.gguf`, COPY_PLANE)."""
        key = gguf_name
        if gguf_name in self.copies:
            key = f"{gguf_name}.{COPY_PLANE}"
            self.copied.add(gguf_name)
        sym = "w_" + re.sub(r"[^A-Za-z0-9_]", "_", gguf_name)
        self.globals[sym] = (
            f'util.global private @{sym} = #flow.parameter.named<"model"::"{key}"> : {mlir_type}'
        )
        return sym

    def layout(self, q: QuantType, n: int, k: int) -> str | None:
        """The repacked layout a [n, k] weight of type `q` takes, or None (bound as GGUF bytes)."""
        if self.tiled and self.dot8 and dot8_layout.supports(q, n, k):
            return "dot8"
        if self.tiled and tiled.supports(q, n, k):
            return "tiled"
        return None

    def helper(self, name: str, render: str) -> str:
        self.funcs.setdefault(name, render)
        return name

    def text(self, module_name: str) -> str:
        parts = [
            f"module @{module_name} {{",
            *self.globals.values(),
            *self.funcs.values(),
            *self.entries,
            "}",
        ]
        return "\n".join(parts) + "\n"


class Body:
    """The body of one entry function: SSA values, with `T` static (1) or dynamic (?)."""

    def __init__(self, mod: ModuleEmitter, dynamic: bool) -> None:
        self.mod = mod
        self.dynamic = dynamic
        self.t = "?" if dynamic else "1"
        # the weight matmuls' operand type as a dequantization and a GEMM (zinc.compiler.gemm: a
        # Vulkan prefill over a fixed number of rows); None: the fused quantized matmul
        self.gemm: str | None = None
        self.lines: list[str] = []
        self._counter = itertools.count(1)
        self._dp4_inputs: dict[tuple[str, int], str] = {}  # (x, k) -> x quantized (dp4)
        self._rope_tables: dict[tuple[str, int, float, float, float, tuple[float, ...]], tuple[str, str]] = {}

    def single_token_view(self) -> Body:
        """The same body, with ops specialised for one token (the last position's logits)."""
        view = Body(self.mod, dynamic=False)
        view.lines, view._counter = self.lines, self._counter
        return view

    def fresh(self, hint: str) -> str:
        return f"%{hint.replace('.', '_')}_{next(self._counter)}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def opaque_index(self, value: int, hint: str) -> str:
        """The index `value`, where the module shares layers (`mod.shared_layers`) behind a
        util.optimization_barrier: IREE cannot fold it into the kernels that take it, so it
        reaches them as a push constant, and every layer shares one executable (folded, each
        layer's KV slab reads were their own: 3x the kernels to compile, and for a GPU's driver
        to build at load). Else the plain constant."""
        c = self.fresh(f"{hint}_c")
        self.emit(f"{c} = arith.constant {value} : index")
        if not self.mod.shared_layers:
            return c
        out = self.fresh(hint)
        self.emit(f"{out} = util.optimization_barrier {c} : index")
        return out

    def call(self, fn: str, args: list[tuple[str, str]], result_type: str, hint: str) -> str:
        out = self.fresh(hint)
        names = ", ".join(a for a, _ in args)
        types = ", ".join(t for _, t in args)
        self.emit(f"{out} = func.call @{fn}({names}) : ({types}) -> {result_type}")
        return out

    def act(self, n: int) -> str:
        """Type of a [T, n] activation."""
        return f"tensor<{self.t}x{n}xf32>"

    def load(self, sym: str, mlir_type: str) -> str:
        out = self.fresh(sym)
        self.emit(f"{out} = util.global.load @{sym} : {mlir_type}")
        return out

    # --- ops -------------------------------------------------------------------------------------

    def linear(self, tensor: str, q: QuantType, n: int, k: int, x: str, hint: str) -> str:
        """`y[T, n] = x[T, k] @ W[n, k]^T` for the GGUF weight `tensor` of quant type `q`.

        Every weight matmul of every architecture goes through here: it binds the weight's
        parameter(s) and picks the kernel for the module's target.
        """
        if self.mod.layout(q, n, k):
            return self._linear_tiled(tensor, q, n, k, x, hint)
        ty = q.param_type(n, k)
        w = self.load(self.mod.param(tensor, ty), ty)
        s = self.mod.dp4_subgroup
        if s and (self.rows or not self.dynamic) and dp4.supports(q, n, k):
            r = self.rows or 1
            name = self.mod.helper(dp4.decode_name(q, n, k, s, r), dp4.render_decode(q, n, k, s, r))
            xq = (self._dp4_quantized(x, k), dp4.quantized_type(k, r))
            y = self.call(name, [(w, ty), xq], f"tensor<{r}x{n}xf32>", hint)
            if not self.rows:
                return y
            out = self.fresh(hint)
            self.emit(f"{out} = tensor.cast {y} : tensor<{r}x{n}xf32> to {self.act(n)}")
            return out
        if self.gemm is not None:
            dt = self.gemm
            wd = self.call(self.mod.helper(dequant_name(q, n, k, dt), render_dequant(q, n, k, dt)),
                           [(w, ty)], f"tensor<{n}x{k}x{dt}>", f"{hint}_w")  # fmt: skip
            gemm = self.mod.helper(gemm_name(n, k, dt), render_gemm(n, k, dt))
            return self.call(gemm, [(x, self.act(k)), (wd, f"tensor<{n}x{k}x{dt}>")], self.act(n), hint)
        # Vulkan (not tiled): the forms of two reduction dims (zinc.compiler.subgroup_matmul); the
        # generic target (no subgroup pipelines: index_inputs off) takes its form over rows (render_rows)
        rows_form = not self.mod.tiled and not self.mod.index_inputs
        name = self.mod.helper(
            matmul_name(q, n, k, self.dynamic), render_matmul(q, n, k, self.dynamic, not self.mod.tiled, rows_form)
        )
        return self.call(name, [(w, ty), (x, self.act(k))], self.act(n), hint)

    def _dp4_quantized(self, x: str, k: int) -> str:
        """x [rows, k] quantized for the dp4 matmuls: once per activation (q/k/v, gate/up share it)."""
        if (x, k) not in self._dp4_inputs:
            r = self.rows or 1
            xs = x
            if self.rows:
                xs = self.fresh("rows_in")
                self.emit(f"{xs} = tensor.cast {x} : {self.act(k)} to tensor<{r}x{k}xf32>")
            name = self.mod.helper(dp4.quantize_name(k, r), dp4.render_quantize(k, r))
            self._dp4_inputs[(x, k)] = self.call(name, [(xs, f"tensor<{r}x{k}xf32>")], dp4.quantized_type(k, r), "xq")
        return self._dp4_inputs[(x, k)]

    def linears(self, parts: list[tuple[str, QuantType, int]], k: int, x: str) -> list[str]:
        """Several weights applied to the same input (q/k/v, gate/up): one matmul on the CPU path.

        `parts` are (GGUF tensor, type, rows); on the tiled path, when the types agree, the
        weights are stacked row-wise at repack time and one kernel computes every output, which
        halves the dispatches per layer; each result is then a slice of it.
        """
        q0 = parts[0][1]
        total = sum(n for _, _, n in parts)
        fusable = all(q == q0 and self.mod.layout(q, n, k) for _, q, n in parts)
        fusable = fusable and self.mod.layout(q0, total, k) == self.mod.layout(q0, parts[0][2], k)
        if not fusable or len(parts) == 1:
            return [self.linear(t, q, n, k, x, t.rsplit(".", 2)[-2]) for t, q, n in parts]
        names = tuple(t for t, _, _ in parts)
        stacked = "+".join(names)
        sizes = tuple(n for _, _, n in parts)
        split = self.mod.layout(q0, total, k) == "dot8" and dot8.splits(q0, total, self.rows, sizes)
        y = self._linear_tiled(stacked, q0, total, k, x, "stacked", names, sizes if split else ())
        if split:
            return self._part_major(y, [(t.rsplit(".", 2)[-2], n) for t, _, n in parts])
        outs, off = [], 0
        for t, _, n in parts:
            out = self.fresh(t.rsplit(".", 2)[-2])
            self.emit(
                f"{out} = tensor.extract_slice {y}[0, {off}] [{'%T' if self.dynamic else '1'}, {n}] [1, 1] "
                f": {self.act(total)} to {self.act(n)}"
            )
            outs.append(out)
            off += n
        return outs

    def _part_major(self, y: str, parts: list[tuple[str, int]]) -> list[str]:
        """The parts of a decode batch's stacked matmul written part-major (zinc.compiler.dot8
        `splits`): each a contiguous slice of it, [rows, n] -> act(n)."""
        r, total = self.rows, sum(n for _, n in parts)
        flat = self.fresh("flat")
        self.emit(f"{flat} = tensor.collapse_shape {y} [[0, 1]] : tensor<{r}x{total}xf32> into tensor<{r * total}xf32>")
        outs, off = [], 0
        for hint, n in parts:
            piece, block, out = self.fresh("piece"), self.fresh("block"), self.fresh(hint)
            self.emit(
                f"{piece} = tensor.extract_slice {flat}[{r * off}] [{r * n}] [1] : tensor<{r * total}xf32> to tensor<{r * n}xf32>"
            )
            self.emit(
                f"{block} = tensor.expand_shape {piece} [[0, 1]] output_shape [{r}, {n}] "
                f": tensor<{r * n}xf32> into tensor<{r}x{n}xf32>"
            )
            self.emit(f"{out} = tensor.cast {block} : tensor<{r}x{n}xf32> to {self.act(n)}")
            outs.append(out)
            off += n
        return outs

    def _linear_tiled(
        self,
        tensor: str,
        q: QuantType,
        n: int,
        k: int,
        x: str,
        hint: str,
        sources: tuple[str, ...] = (),
        parts: tuple[int, ...] = (),
    ) -> str:
        layout = self.mod.layout(q, n, k)
        assert layout is not None
        kern = LAYOUTS[layout]
        self.mod.repacked[tensor] = (sources or (tensor,), q, n, k, layout)
        planes = kern.plane_types(q, n, k)
        args = [(self.load(self.mod.param(f"{tensor}.{p}", ty), ty), ty) for p, ty in planes.items()]
        decode = self.rows or not self.dynamic
        kv = self.kv_prefetch if layout == "dot8" and self.kv_rows and decode else None
        if kv is not None:
            self.kv_prefetch = None
        if self.rows:  # a decode batch: the single-token kernel with a row loop, on static rows
            name = self._decode_kernel(kern, q, n, k, self.rows, kv, parts)
            xs = self.fresh("rows_in")
            self.emit(f"{xs} = tensor.cast {x} : {self.act(k)} to tensor<{self.rows}x{k}xf32>")
            ins = [*args, (xs, f"tensor<{self.rows}x{k}xf32>"), *self._kv_args(kv, self.rows)]
            y = self.call(name, ins, f"tensor<{self.rows}x{n}xf32>", hint)
            if parts:  # part-major: the caller slices it (`_part_major`)
                return y
            out = self.fresh(hint)
            self.emit(f"{out} = tensor.cast {y} : tensor<{self.rows}x{n}xf32> to {self.act(n)}")
            return out
        if self.dynamic:
            name = self.mod.helper(kern.prefill_name(q, n, k), kern.render_prefill(q, n, k))
        else:
            name = self._decode_kernel(kern, q, n, k, 0, kv)
        return self.call(name, [*args, (x, self.act(k)), *self._kv_args(kv, 1)], self.act(n), hint)

    def _decode_kernel(
        self, kern: WeightLayout, q: QuantType, n: int, k: int, rows: int, kv: KvPrefetch | None, parts: tuple[int, ...] = ()
    ) -> str:
        """The decode kernel of `rows` rows (0: one token) as a helper; with `kv` or `parts` (only
        set for the dot8 layout) the dot8 kernel that also prefetches K/V rows, or writes its
        output part-major."""
        if kv is not None or parts:
            return self.mod.helper(
                dot8.decode_name(q, n, k, rows, kv, parts), dot8.render_decode(q, n, k, rows, kv, parts)
            )
        return self.mod.helper(kern.decode_name(q, n, k, rows), kern.render_decode(q, n, k, rows))

    def _kv_args(self, kv: KvPrefetch | None, rows: int) -> list[tuple[str, str]]:
        """The operands of a matmul that prefetches `kv`: the slab, the rows' slots and lengths, the layer."""
        if kv is None or self.kv_rows is None:
            return []
        layer = self.fresh("kv_layer")
        self.emit(f"{layer} = arith.constant {kv.layer} : index")
        ctx, lens = self.kv_rows
        return [("%cache", f"tensor<?x{kv.slab}>"), (ctx, f"tensor<{rows}x?xi32>"), (lens, f"tensor<{rows}xi32>"),
                (layer, "index")]  # fmt: skip

    def gather(self, q: QuantType, w: str, rows: int, cols: int, ids: str) -> str:
        name = self.mod.helper(
            gather_name(q, rows, cols, self.dynamic), render_gather(q, rows, cols, self.dynamic)
        )
        return self.call(
            name, [(w, q.param_type(rows, cols)), (ids, f"tensor<{self.t}xi32>")], self.act(cols), "embd"
        )

    def rmsnorm(self, x: str, w: str, d: int, eps: float, hint: str) -> str:
        """RMSNorm of every row of x [T, d]: on the CPU the hand-written dispatch of
        mlir/rmsnorm_cpu.mlir (one workgroup per row, the sum of squares in 16 lanes) where d is a
        multiple of `NORM_LANES`, else the linalg form of mlir/rmsnorm.mlir (IREE adds its squares
        one after another: 0.5 us a SmolLM2 row, 61 norms a token)."""
        subs = {"D": str(d), "DF": f32_const(float(d)), "EPS": f32_const(eps)}
        if not self._norm_by_hand(d):
            name = f"rmsnorm_{self.t_tag}_{d}"
            self.mod.helper(name, template("rmsnorm.mlir").substitute(NAME=name, **subs, **t_dims(self.dynamic)))
            return self.call(name, [(x, self.act(d)), (w, f"tensor<{d}xf32>")], self.act(d), hint)
        name = f"rmsnorm_cpu_{d}_e{_sym(eps)}"
        self.mod.helper(name, template("rmsnorm_cpu.mlir").substitute(NAME=name, C=str(d // NORM_LANES), **subs))
        return self._rows_call(name, [(x, d)], [(w, f"tensor<{d}xf32>")], f"x{d}xf32", hint)

    def add_rmsnorm(self, x: str, r: str, w: str, d: int, eps: float, hint: str) -> tuple[str, str]:
        """The residual add s = x + r [T, d] and RMSNorm(s): on the CPU (where `rmsnorm` takes the
        hand-written dispatch) one dispatch of mlir/add_rmsnorm_cpu.mlir, with the bits of the
        two run apart; else `elementwise` add, then `rmsnorm`. Returns (s, the norm)."""
        if not self._norm_by_hand(d):
            s = self.elementwise("add", x, r, d, f"{hint}_in")
            return s, self.rmsnorm(s, w, d, eps, hint)
        name = f"add_rmsnorm_cpu_{d}_e{_sym(eps)}"
        subs = {"D": str(d), "DF": f32_const(float(d)), "EPS": f32_const(eps), "C": str(d // NORM_LANES)}
        self.mod.helper(name, template("add_rmsnorm_cpu.mlir").substitute(NAME=name, **subs))
        s, y = self._rows_call_n(name, [(x, d), (r, d)], [(w, f"tensor<{d}xf32>")], f"x{d}xf32", hint, 2)
        return s, y

    def _norm_by_hand(self, d: int) -> bool:
        """Whether a norm over d takes the CPU's hand-written dispatch (16 lanes)."""
        return self.mod.tiled and d % NORM_LANES == 0

    def _rows_call(self, fn: str, rows: list[tuple[str, int]], rest: list[tuple[str, str]], out: str, hint: str) -> str:
        """Call a CPU dispatch that takes its [T, *] f32 operands (`rows`: value and width) and
        returns `tensor<?{out}>` (`out`: the type past T, as "x576xf32" or "xi32") with a dynamic
        T: a one-token body's [1, *] values are cast to [?, *] and the result back to [1, ...]."""
        return self._rows_call_n(fn, rows, rest, out, hint, 1)[0]

    def _rows_call_n(
        self, fn: str, rows: list[tuple[str, int]], rest: list[tuple[str, str]], out: str, hint: str, n: int
    ) -> list[str]:
        """`_rows_call` of a dispatch with `n` results, each `tensor<?{out}>`."""
        args = []
        for value, width in rows:
            if self.t != "?":
                cast = self.fresh("rows")
                self.emit(f"{cast} = tensor.cast {value} : {self.act(width)} to tensor<?x{width}xf32>")
                value = cast
            args.append((value, f"tensor<?x{width}xf32>"))
        ty = f"tensor<?{out}>"
        if n == 1:
            results = [self.call(fn, [*args, *rest], ty, hint)]
        else:
            call = self.fresh(hint)
            names = ", ".join(a for a, _ in [*args, *rest])
            types = ", ".join(t for _, t in [*args, *rest])
            self.emit(f"{call}:{n} = func.call @{fn}({names}) : ({types}) -> ({', '.join([ty] * n)})")
            results = [f"{call}#{i}" for i in range(n)]
        if self.t == "?":
            return results
        static = []
        for value in results:
            y = self.fresh(hint)
            self.emit(f"{y} = tensor.cast {value} : {ty} to tensor<{self.t}{out}>")
            static.append(y)
        return static

    def rope(
        self, x: str, start: str, heads: int, head_dim: int, n_rot: int, base: float, hint: str, by_hand: bool = True,
        freq_factors: tuple[float, ...] = (),
    ) -> str:
        """RoPE at positions `start` + t, or, when `start` names a [T] i32 tensor (`per_row`), at
        each row's own position (a batch of sequences). On the CPU, where `by_hand` and every dim
        rotates, the hand-written dispatch of mlir/rope_norm_cpu.mlir (IREE compiles the linalg
        form one element at a time: SmolLM2's q of 8 rows, 62 -> 14 us a step); else the linalg
        form of mlir/rope_norm.mlir, which IREE can fuse with what follows it. `freq_factors`
        (n_rot/2 of them, Llama 3's rope_freqs) divide each pair's frequency."""
        hhd, pairs = heads * head_dim, head_dim // 2
        cs, sn = self.rope_table(start, pairs, -2.0 / n_rot, base, 1.0, freq_factors)
        if by_hand and self.mod.tiled and n_rot == head_dim and head_dim % NORM_LANES == 0:
            name = f"rope_norm_cpu_{heads}x{head_dim}"
            subs = {"H": str(heads), "HD": str(head_dim), "C": str(head_dim // NORM_LANES)}
            self.mod.helper(name, template("rope_norm_cpu.mlir").substitute(NAME=name, HHD=str(hhd), P=str(pairs), **subs))
            return self._rows_call(name, [(x, hhd), (cs, pairs), (sn, pairs)], [], f"x{hhd}xf32", hint)
        name = f"rope_norm_{self.t_tag}_{heads}x{head_dim}_r{n_rot}"
        subs = {
            "NAME": name, "HHD": str(hhd), "H": str(heads), "P": str(pairs), "NR2": str(n_rot // 2),
            **t_dims(self.dynamic),
        }  # fmt: skip
        self.mod.helper(name, template("rope_norm.mlir").substitute(subs))
        return self.call(name, [(x, self.act(hhd)), (cs, self.act(pairs)), (sn, self.act(pairs))], self.act(hhd), hint)

    def rope_table(
        self, start: str, pairs: int, neg2_over_nr: float, base: float, scale: float, factors: tuple[float, ...] = ()
    ) -> tuple[str, str]:
        """cos and sin [T, pairs] of this step's RoPE angles, emitted once per step and kind; every
        layer's rope reads them (computing them in each rope was 10% of a batch-of-8 decode step).
        With per-pair frequency `factors`, the frequencies are a constant (`rope_freqs`,
        mlir/rope_table_freqs.mlir); without, the table is mlir/rope_table.mlir's."""
        key = (start, pairs, neg2_over_nr, base, scale, factors)
        found = self._rope_tables.get(key)
        if found is not None:
            return found
        name = f"rope_table_{self.t_tag}{self._pos_tag}_{pairs}_n{_sym(neg2_over_nr)}_b{_sym(base)}_s{_sym(scale)}"
        subs = {
            "NAME": name, "P": str(pairs), "NEG2_OVER_NR": f32_const(neg2_over_nr), "BASE": f32_const(base),
            "FREQ_SCALE": f32_const(scale), **t_dims(self.dynamic), **self._pos_subs(),
        }  # fmt: skip
        if factors:
            freqs = rope_freqs(base, neg2_over_nr, factors, pairs)
            name += "_f" + hashlib.sha256(freqs.tobytes()).hexdigest()[:12]
            fq = f"tensor<{pairs}xf32>"
            ins = f"%pos, %fq : tensor<{self.t}xi32>, {fq}" if self.per_row else f"%fq : {fq}"
            dense = "[" + ", ".join(f32_const(float(f)) for f in freqs) + "]"
            subs = {**subs, "NAME": name, "FREQS": dense, "INS": ins}
            self.mod.helper(name, template("rope_table_freqs.mlir").substitute(subs))
        else:
            self.mod.helper(name, template("rope_table.mlir").substitute(subs))
        tab = self.act(pairs)
        cs, sn = self.fresh("rope_cos"), self.fresh("rope_sin")
        self.emit(f"{cs}, {sn} = func.call @{name}({start}, %T) : ({self._pos_type}, index) -> ({tab}, {tab})")
        self._rope_tables[key] = (cs, sn)
        return cs, sn

    per_row = False  # positions come per row from a [T] i32 tensor (batched decode)
    rows = 0  # a decode batch of this many rows (T = ? in the types, static in fact): batch kernels
    # a decode step's rows: their slots and cached lengths as static [R, ?] and [R] i32 values
    # (the operands of a matmul that prefetches K/V rows), and the prefetch the next integer
    # dot-product matmul takes on (`_linear_tiled` clears it: one dispatch prefetches a layer once)
    kv_rows: tuple[str, str] | None = None
    kv_prefetch: KvPrefetch | None = None

    @property
    def _pos_tag(self) -> str:
        return "p" if self.per_row else ""

    @property
    def _pos_type(self) -> str:
        return f"tensor<{self.t}xi32>" if self.per_row else "index"

    def _pos_subs(self) -> dict[str, str]:
        """rope_table's position placeholders: `start` + t, or each row's own, read from `%pos`."""
        dims = {"DIMS": "{%T}" if self.dynamic else ""}
        if not self.per_row:
            pos = {"POS_ARG": "%start: index", "POS_EXPR": "%p = arith.addi %start, %t : index"}
            return {**dims, **pos, "IN_MAP": "", "INS": "", "IN_ARG": ""}
        ids = f"tensor<{self.t}xi32>"
        pos = {"POS_ARG": f"%pos: {ids}", "POS_EXPR": "%p = arith.index_cast %pe : i32 to index"}
        inputs = {"IN_MAP": "affine_map<(t, i) -> (t)>, ", "INS": f"ins(%pos : {ids}) ", "IN_ARG": "%pe: i32, "}
        return {**dims, **pos, **inputs}

    def elementwise(self, op: str, a: str, b: str, d: int, hint: str) -> str:
        suffix = f"{self.t_tag}_{d}"
        self.mod.helper(
            f"add_{suffix}",
            template("elementwise.mlir").substitute(SUFFIX=suffix, D=str(d), **t_dims(self.dynamic)),
        )
        return self.call(f"{op}_{suffix}", [(a, self.act(d)), (b, self.act(d))], self.act(d), hint)

    def argmax(self, logits: str, vocab: int) -> str:
        """The greedy token of logits [1, V] (the first on exact ties)."""
        if self._vector_argmax(vocab):  # the CPU's dispatch, over rows
            return self.argmax_rows(logits, vocab)
        name = self._argmax_helper(vocab, dynamic=False)
        return self.call(name, [(logits, f"tensor<1x{vocab}xf32>")], "tensor<1xi32>", "token")

    def argmax_rows(self, logits: str, vocab: int) -> str:
        """The greedy token of every row of logits [T, V]: on the CPU the hand-written dispatch of
        mlir/argmax_cpu.mlir (one workgroup per row, 16 lanes) where V is a multiple of
        `ARGMAX_LANES`, else the two-level linalg reductions of mlir/argmax.mlir."""
        if self._vector_argmax(vocab):
            name = f"argmax_cpu_{vocab}"
            self.mod.helper(name, template("argmax_cpu.mlir").substitute(NAME=name, V=str(vocab), C=str(vocab // ARGMAX_LANES)))
            return self._rows_call(name, [(logits, vocab)], [], "xi32", "tokens")
        name = self._argmax_helper(vocab, dynamic=True)
        return self.call(name, [(logits, f"tensor<?x{vocab}xf32>")], "tensor<?xi32>", "tokens")

    def _vector_argmax(self, vocab: int) -> bool:
        return self.mod.tiled and vocab % ARGMAX_LANES == 0

    def _argmax_helper(self, vocab: int, dynamic: bool) -> str:
        """mlir/argmax.mlir for [1, V] or [T, V]: blocks of B (the power of two at least V, at most
        1024), the row padded with -inf to NB whole blocks."""
        block = min(1024, 1 << (vocab - 1).bit_length())
        blocks = -(-vocab // block)
        name = f"argmax_{'rows_' if dynamic else ''}{vocab}"
        subs = {
            "NAME": name, "V": str(vocab), "B": str(block), "NB": str(blocks), "VP": str(blocks * block),
            "PAD": str(blocks * block - vocab), **t_dims(dynamic), **_argmax_indices(blocks, block, self.mod.index_inputs),
        }  # fmt: skip
        return self.mod.helper(name, template("argmax.mlir").substitute(subs))

    @property
    def t_tag(self) -> str:
        return "t" if self.dynamic else "1"

    # --- ops of the qwen2, qwen3 and gemma3 recipes ---------------------------------------------

    def rope_neox(
        self, x: str, start: str, heads: int, head_dim: int, base: float, freq_scale: float, hint: str,
        freq_factors: tuple[float, ...] = (), bias: str | None = None,
    ) -> str:
        """NEOX RoPE (dim i pairs with i + head_dim/2) over every dim, positions scaled by `freq_scale`
        and pair i's frequency divided by `freq_factors[i]` when there are factors; with `bias`
        ([heads*head_dim]), of x + bias, added in the same dispatch."""
        hhd_n, p = heads * head_dim, head_dim // 2
        name = f"rope_neox_{self.t_tag}_{heads}x{head_dim}{'_bias' if bias else ''}"
        subs = {
            "NAME": name, "HHD": str(hhd_n), "H": str(heads), "P": str(p), **t_dims(self.dynamic),
            **_neox_bias(heads, p, hhd_n, bias is not None),
        }  # fmt: skip
        self.mod.helper(name, template("rope_neox.mlir").substitute(subs))
        cs, sn = self.rope_table(start, p, -2.0 / head_dim, base, freq_scale, freq_factors)
        hhd, tab = self.act(hhd_n), self.act(p)
        args = [(x, hhd), (cs, tab), (sn, tab)] + ([(bias, f"tensor<{hhd_n}xf32>")] if bias else [])
        return self.call(name, args, hhd, hint)

    def rmsnorm_heads(self, x: str, w: str, heads: int, head_dim: int, eps: float, hint: str) -> str:
        """RMSNorm of each head of x [T, heads*head_dim] with one [head_dim] weight (QK-norm)."""
        name = f"rmsnorm_heads_{self.t_tag}_{heads}x{head_dim}"
        subs = {
            "NAME": name, "HHD": str(heads * head_dim), "H": str(heads), "HD": str(head_dim),
            "HDF": f32_const(float(head_dim)), "EPS": f32_const(eps), **t_dims(self.dynamic),
        }  # fmt: skip
        self.mod.helper(name, template("rmsnorm_heads.mlir").substitute(subs))
        hhd = self.act(heads * head_dim)
        return self.call(name, [(x, hhd), (w, f"tensor<{head_dim}xf32>")], hhd, hint)

    def attention_window(
        self,
        q: str,
        kv: tuple[str, str],
        start: str,
        heads: int,
        heads_kv: int,
        head_dim: int,
        scale: float,
        window: int,
    ) -> str:
        """Attention of T queries at positions `start` + t over the sequence's keys and values by
        position (`kv`, [S, Hkv, hd]: row s is position s), with query scale `scale` and keys
        limited to the last `window` positions (0: no window): mlir/attention_window.mlir, or on
        the CPU's prefill the flash attention of compiler/attention_prefill.py."""
        win = window or NO_WINDOW
        name = f"attention_w{win}_s{_sym(scale)}_{self.t_tag}_{heads}x{heads_kv}x{head_dim}"
        rows = f"tensor<?x{heads_kv}x{head_dim}xf32>"
        hhd = self.act(heads * head_dim)
        if self.mod.tiled and self.dynamic:  # the CPU's prefill: the hand-written flash attention
            name = f"attention_prefill_w{win}_s{_sym(scale)}_{heads}x{heads_kv}x{head_dim}"
            text = render_prefill_attention(name, heads, heads_kv, head_dim, f32_const(scale), win)
            self.mod.helper(name, text)
            return self.call(name, [(q, hhd), (kv[0], rows), (kv[1], rows), (start, "index")], hhd, "attn")
        subs = {
            "NAME": name, "HHD": str(heads * head_dim), "HKV": str(heads_kv), "G": str(heads // heads_kv),
            "HD": str(head_dim), "SCALE": f32_const(scale), "WINDOW": str(win),
            "DYN_S": "%T, %S" if self.dynamic else "%S", **t_dims(self.dynamic),
        }  # fmt: skip
        self.mod.helper(name, template("attention_window.mlir").substitute(subs))
        return self.call(name, [(q, hhd), (kv[0], rows), (kv[1], rows), (start, "index")], hhd, "attn")

    def gelu_gated(self, gate: str, up: str, d: int, hint: str) -> str:
        """gelu_tanh(gate) * up on [T, d]."""
        suffix = f"{self.t_tag}_{d}"
        name = self.mod.helper(
            f"geglu_{suffix}",
            template("geglu.mlir").substitute(SUFFIX=suffix, D=str(d), **t_dims(self.dynamic)),
        )
        return self.call(name, [(gate, self.act(d)), (up, self.act(d))], self.act(d), hint)

    def bias_add(self, x: str, bias: str, d: int, hint: str) -> str:
        """x [T, d] + bias [d]."""
        suffix = f"{self.t_tag}_{d}"
        name = self.mod.helper(
            f"bias_{suffix}",
            template("bias_add.mlir").substitute(SUFFIX=suffix, D=str(d), **t_dims(self.dynamic)),
        )
        return self.call(name, [(x, self.act(d)), (bias, f"tensor<{d}xf32>")], self.act(d), hint)

    def scale(self, x: str, factor: float, d: int, hint: str) -> str:
        """x [T, d] * factor."""
        name = f"scale_{self.t_tag}_{d}_{_sym(factor)}"
        subs = {"NAME": name, "D": str(d), "S": f32_const(factor), **t_dims(self.dynamic)}
        self.mod.helper(name, template("scale.mlir").substitute(subs))
        return self.call(name, [(x, self.act(d))], self.act(d), hint)

    def softcap(self, x: str, cap: float, d: int, hint: str) -> str:
        """cap * tanh(x / cap) on [T, d] (final logit softcapping)."""
        name = f"softcap_{self.t_tag}_{d}_{_sym(cap)}"
        subs = {
            "NAME": name, "D": str(d), "CAP": f32_const(cap), "INV_CAP": f32_const(1.0 / cap),
            **t_dims(self.dynamic),
        }  # fmt: skip
        self.mod.helper(name, template("softcap.mlir").substitute(subs))
        return self.call(name, [(x, self.act(d))], self.act(d), hint)


NO_WINDOW = 2**31 - 1  # an attention window no position distance reaches
ARGMAX_LANES = 16  # the CPU argmax's vector (mlir/argmax_cpu.mlir)
NORM_LANES = 16  # the vector of the CPU RMSNorm and RoPE (mlir/rmsnorm_cpu.mlir, rope_norm_cpu.mlir)


def rope_freqs(base: float, neg2_over_nr: float, factors: tuple[float, ...], pairs: int) -> np.ndarray[Any, Any]:
    """Each pair's RoPE frequency [pairs] f32 when pairs have frequency factors (Llama 3's
    rope_freqs): theta_scale^i / factors[i] with theta_scale = base^(-2/n_rot), in f32 the way
    llama.cpp's CPU rope cache (ggml_rope_cache_init) computes it, the power by repeated
    multiplication; pairs past the factors (partial rotary: they do not rotate) take factor 1.
    Angles p * freq[i] from these come closer to llama.cpp's (p * theta_scale^i accumulated in f32,
    then / factor) than the exact frequencies rounded once to f32: Llama 3.1 8B's over positions
    below 131072 differ from llama.cpp's by 2.6e-4 rad on average against 4.7e-4 (1.2e-2 at most
    either way, the f32 rounding of p * freq itself)."""
    ts = np.float32(np.power(np.float32(base), np.float32(neg2_over_nr)))
    out = np.empty(pairs, dtype=np.float32)
    acc = np.float32(1.0)
    for i in range(pairs):
        out[i] = acc / np.float32(factors[i] if i < len(factors) else 1.0)
        acc = np.float32(acc * ts)
    return out


def _sym(x: float) -> str:
    """A float as a symbol-name fragment (helpers with baked-in constants differ by name)."""
    return f"{x:.9g}".replace(".", "p").replace("-", "m").replace("+", "")


def _neox_bias(heads: int, p: int, hhd: int, on: bool) -> dict[str, str]:
    """mlir/rope_neox.mlir's BIAS_* placeholders: the bias's halves as two more inputs of the loop,
    added to the halves of x it reads; all empty without a bias."""
    if not on:
        return dict.fromkeys(("BIAS_ARG", "BIAS_SETUP", "BIAS_MAPS", "BIAS_INS", "BIAS_TYPES", "BIAS_RAW", "BIAS_BB", "BIAS_ADD"), "")
    half = f"tensor<{heads}x{p}xf32>"
    setup = [
        f"  %br = tensor.expand_shape %bias [[0, 1, 2]] output_shape [{heads}, 2, {p}] : tensor<{hhd}xf32> into tensor<{heads}x2x{p}xf32>",
        *(f"  %b{s} = tensor.extract_slice %br[0, {s}, 0] [{heads}, 1, {p}] [1, 1, 1] : tensor<{heads}x2x{p}xf32> to {half}" for s in (0, 1)),
    ]
    hmap = "affine_map<(t, h, s, i) -> (h, i)>"
    return {
        "BIAS_ARG": f", %bias: tensor<{hhd}xf32>", "BIAS_SETUP": "".join("\n" + line for line in setup), "BIAS_MAPS": f", {hmap}, {hmap}",
        "BIAS_INS": ", %b0, %b1", "BIAS_TYPES": f", {half}, {half}", "BIAS_RAW": "_x", "BIAS_BB": ", %blo: f32, %bhi: f32",
        "BIAS_ADD": "\n      %lo = arith.addf %lo_x, %blo : f32\n      %hi = arith.addf %hi_x, %bhi : f32",
    }
