"""Compile every Triton kernel of the GPU runtime for a CUDA target, with no GPU: the front end,
the optimizer and ptxas all run, so a kernel that would not compile on the device fails here.
The interpreter (TRITON_INTERPRET=1, as the other kernel tests run) executes the Python of a
kernel and never types or lowers it, so it cannot catch that.

Each kernel is compiled as the JIT specializes it at run time (pointers and whole-number
arguments 16-byte divisible, except those a kernel declares `do_not_specialize`), and the slot
kernels' weight tiles must compile to 16-byte vector loads: a hint lost on the way (the in-launch
fill path once compiled every pair's loads 2 bytes at a time, 1.4x slower on the H200) fails here.

Run in its own process (tests/test_kernels_compile.py): triton reads TRITON_INTERPRET when it is
first imported. Exit status 0: every variant compiled; 77: no CUDA backend in this triton (skip).

    python tests/compile_kernels.py [sm]     # default sm 90 (H100/H200); 89 for an RTX 4090
"""

from __future__ import annotations

import itertools
import re
import sys

SHARED_BYTES = {86: 101376, 89: 101376, 90: 232448}  # the most shared memory a block can have
SLOT_ARGS = {"token_ptr": "*i32", "slot_ptr": "*i32", "bank_addr": "i64", "bank_stride": "i64", "fill_ptr": "*i32"}


def variants(sm: int = 90) -> list[tuple[str, object, dict[str, str], dict[str, object]]]:
    """(name, kernel, signature, constexprs) for every kernel and every constexpr branch decode takes
    on an sm_`sm` card (programmatic dependent launch from sm_90)."""
    from runtime.gpu.kernels import (
        block_gemv,
        cast_out,
        expert_fill,
        fp8_gemv,
        grouped_block_experts,
        grouped_experts,
        rms_norm,
        rotary,
        route_plan,
        router_topk,
        slot_experts,
    )

    pdl = sm >= 90
    out = []
    for fill, even in itertools.product((False, True), (True, False)):
        for zero in (False, True):
            sig = {"x_ptr": "*bf16", "stride_x": "i32", "w_ptr": "*bf16", "stride_slot": "i64", "w13_at": "i32",
                   **{k: SLOT_ARGS[k] for k in ("token_ptr", "slot_ptr")}, "part_ptr": "*fp32",
                   **{k: SLOT_ARGS[k] for k in ("bank_addr", "bank_stride", "fill_ptr")}, "out_ptr": "*fp32",
                   "stride_out": "i32", "num_out": "i32", "zero_chunk": "i32"}
            out.append((f"slot_experts gate_up fill={fill} even={even} zero={zero}", slot_experts._gate_up_kernel,
                        sig, {"HIDDEN": 2048, "INTER": 768 if even else 760, "BLOCK_I": 16, "BLOCK_H": 256,
                              "H_SPAN": 512, "EVEN": even, "FILL": fill, "ESIZE": 2, "BANK_ALIGN": 16, "ZERO": zero,
                              "BLOCK_Z": 64, "PDL": pdl}))
        sig = {"part_ptr": "*fp32", "w_ptr": "*bf16", "stride_slot": "i64", "w2_at": "i32",
               **{k: SLOT_ARGS[k] for k in ("token_ptr", "slot_ptr")}, "weight_ptr": "*bf16", "out_ptr": "*fp32",
               "stride_out": "i32", **{k: SLOT_ARGS[k] for k in ("bank_addr", "bank_stride", "fill_ptr")},
               "bias_ptr": "*fp32", "alpha": "fp32", "limit": "fp32"}
        # gpt-oss's form (clamped, biased) where no fill is made in the launch; plain SwiGLU otherwise
        act, bias = (0, False) if fill or not even else (2, True)
        out.append((f"slot_experts down fill={fill} even={even} act={act}", slot_experts._down_kernel, sig,
                    {"HIDDEN": 2048, "INTER": 768 if even else 760, "BLOCK_O": 32, "BLOCK_K": 256, "K_SPAN": 256,
                     "SPLIT": 4, "EVEN": even, "BANK_ALIGN": 16, "FILL": fill, "ESIZE": 2, "EARLY": pdl, "PDL": pdl,
                     "ACT": act, "BIAS": bias}))
    for clock_mode, n_pcie_mode in ((0, 0), (1, 1), (2, 2), (2, 0)):
        sig = {"ids_ptr": "*i64", "n_ids": "i32", "layer": "i32", "num_experts": "i32", "table_ptr": "*i32",
               "owner_ptr": "*i32", "last_used_ptr": "*i64", "num_slots": "i32",
               "clock_arg": "i64" if clock_mode == 0 else "*i64", "n_pcie_max_arg": "i32" if n_pcie_mode == 0 else "*i32",
               "n_table_last": "i32",
               **{name: "*i32" for name in ("unique_ptr", "status_ptr", "slot_ptr", "evicted_ptr", "counts_ptr",
                                            "inverse_ptr", "pair_slot_ptr", "pair_fill_ptr")},
               "totals_ptr": "*i64"}
        out.append((f"route_plan clock={clock_mode} n_pcie={n_pcie_mode}", route_plan._route_plan_kernel, sig,
                    {"CLOCK_ON_DEVICE": clock_mode, "N_PCIE_MODE": n_pcie_mode, "BLOCK_N": 16, "BLOCK_S": 4096,
                     "BLOCK_T": 16, "BLOCK_R": 256, "ACCUMULATE": True, "PDL": pdl}))
    sig = {"bank_addr": "i64", "stride_words": "i64", "unique_ptr": "*i32", "status_ptr": "*i32", "slot_ptr": "*i32",
           "slots_ptr": "*i64", "slot_words": "i64", "n_rows": "i32"}
    out.append(("expert_fill", expert_fill._expert_fill_kernel, sig, {"CHUNK": 4096, "PCIE_CODE": 1}))
    for dst in ("*bf16", "*fp16"):
        out.append((f"cast_out {dst[1:]}", cast_out._cast_kernel, {"src_ptr": "*fp32", "dst_ptr": dst, "n": "i32"},
                    {"BLOCK": cast_out.BLOCK, "PDL": pdl}))
    for offset in (False, True):
        sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "n_cols": "i32", "stride_x": "i32",
               "stride_out": "i32", "eps": "fp32", "offset": "fp32"}
        out.append((f"rms_norm offset={offset}", rms_norm._rms_norm_kernel, sig, {"BLOCK": 2048, "OFFSET": offset}))
    for rot in (128, 64):
        sig = {"x_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "out_ptr": "*bf16", "heads": "i32",
               **{name: "i32" for name in ("stride_t", "stride_h", "stride_cos", "stride_out_t", "stride_out_h")}}
        out.append((f"rotary rot={rot}", rotary._rotary_kernel, sig, {"DIM": 128, "ROT": rot, "BLOCK": 128}))
    for kind, code in block_gemv.KINDS.items():
        cols = 2880 if kind == "mxfp4" else 2048  # (gpt-oss's MXFP4 rows: no whole super-blocks)
        sb_bytes = block_gemv.SUPER_BLOCK_BYTES.get(code, 0)
        row_bytes = cols // 32 * block_gemv.MXFP4_BLOCK_BYTES if kind == "mxfp4" else cols // 256 * sb_bytes
        for source in ("*bf16", "*fp32"):
            sig = {"in_ptr": source, "stride_in": "i32", "index_ptr": "*i32", "slots_ptr": "*u8", "stride_slot": "i64",
                   "part_offset": "i64", "slot_of_ptr": "*i32", "out_ptr": "*fp32", "stride_out": "i32"}
            out.append((f"block_gemv {kind} {source[1:]}", block_gemv._block_gemv_kernel, sig,
                        {"ROWS": 1536, "COLS": cols, "KIND": code, "SB_BYTES": sb_bytes, "ROW_BYTES": row_bytes,
                         "BLOCK_R": 8, "SPAN": 8}))
    for kind, code in fp8_gemv.KINDS.items():
        sig = {"in_ptr": "*bf16", "stride_in": "i32", "index_ptr": "*i32", "slots_ptr": "*u8", "stride_slot": "i64",
               "part_offset": "i64", "scale_offset": "i64", "slot_of_ptr": "*i32", "out_ptr": "*fp32",
               "stride_out": "i32"}
        out.append((f"fp8_gemv {kind}", fp8_gemv._fp8_gemv_kernel, sig,
                    {"ROWS": 1536, "COLS": 7168, "SCALE_ROWS": 128, "SCALE_COLS": 128, "KIND": code, "BLOCK_R": 16}))
    plan = {"rows_ptr": "*i64", "starts_ptr": "*i64", "counts_ptr": "*i64"}
    for block_m in (16, 32, 64):
        tiles = {"HIDDEN": 2048, "INTER": 768, "BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64, "UPCAST": False}
        sig = {"x_ptr": "*bf16", "stride_x": "i32", "w_ptr": "*bf16", "stride_row": "i64", "w13_at": "i64", **plan,
               "tokens_ptr": "*i64", "act_ptr": "*bf16", "stride_act": "i32"}
        out.append((f"grouped_experts gate_up block_m={block_m}", grouped_experts._gate_up_kernel, sig, tiles))
        sig = {"act_ptr": "*bf16", "stride_act": "i32", "w_ptr": "*bf16", "stride_row": "i64", "w2_at": "i64", **plan,
               "tokens_ptr": "*i64", "pair_weight_ptr": "*fp32", "out_ptr": "*fp32", "stride_out": "i32"}
        out.append((f"grouped_experts down block_m={block_m}", grouped_experts._down_kernel, sig, tiles))
    codes, sb = block_gemv.KINDS, block_gemv.SUPER_BLOCK_BYTES
    for gate, up, down in (("q4_k", "q4_k", "q6_k"), ("q5_k", "q5_k", "q6_k"), ("q8_0", "q8_0", "q8_0"),
                           ("q4_k", "q5_k", "q4_k")):  # Q4_K_M, Q5_K_M, Q8_0, gate and up apart
        tiles = {"HIDDEN": 2048, "INTER": 768, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "UPCAST": False}
        sig = {"x_ptr": "*bf16", "stride_x": "i32", "rec_ptr": "*u8", "stride_row": "i64", "gate_at": "i64",
               "up_at": "i64", **plan, "tokens_ptr": "*i64", "act_ptr": "*bf16", "stride_act": "i32"}
        out.append((f"grouped_block_experts gate_up {gate} {up}", grouped_block_experts._gate_up_kernel, sig,
                    {**tiles, "GATE_KIND": codes[gate], "GATE_SB": sb[codes[gate]], "UP_KIND": codes[up],
                     "UP_SB": sb[codes[up]]}))
        sig = {"act_ptr": "*bf16", "stride_act": "i32", "rec_ptr": "*u8", "stride_row": "i64", "down_at": "i64",
               **plan, "tokens_ptr": "*i64", "pair_weight_ptr": "*fp32", "out_ptr": "*fp32", "stride_out": "i32"}
        out.append((f"grouped_block_experts down {down}", grouped_block_experts._down_kernel, sig,
                    {**tiles, "DOWN_KIND": codes[down], "DOWN_SB": sb[codes[down]]}))
    sig = {"logits_ptr": "*bf16", "ids_ptr": "*i64", "weights_ptr": "*fp32", "num_experts": "i32", "stride_row": "i32"}
    out.append(("router_topk", router_topk._router_topk_kernel, sig,
                {"K": 8, "BLOCK_E": 128, "BLOCK_K": 8, "NORMALIZE": True}))
    return out


def main() -> int:
    import triton
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in backends:
        print("this triton has no CUDA backend")
        return 77
    sm = int(sys.argv[1]) if len(sys.argv) > 1 else 90
    target = GPUTarget("cuda", sm, 32)
    failed = 0
    for name, kernel, signature, constexprs in variants(sm):
        unspecialized = {param.name for param in kernel.params if param.do_not_specialize}
        attrs = {(i,): [["tt.divisibility", 16]] for i, (arg, kind) in enumerate(signature.items())
                 if arg not in unspecialized and (kind.startswith("*") or kind in ("i32", "i64"))}
        signature = {**signature, **{k: "constexpr" for k in constexprs}}
        options = getattr(sys.modules[kernel.fn.__module__], "LAUNCH", {})  # (a module launching off triton's defaults)
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                                  target=target, options=options)
        print(f"sm_{sm} {name}: {len(compiled.asm['cubin'])} bytes of cubin")
        if compiled.metadata.shared > SHARED_BYTES.get(sm, SHARED_BYTES[90]):
            print(f"  {name}: {compiled.metadata.shared} bytes of shared memory, more than an sm_{sm} block has")
            failed = 1
        scalar_loads = len(re.findall(r"ld\.global(?:\.\w+)*\.b16\b", compiled.asm["ptx"]))
        if name.startswith("slot_experts") and constexprs.get("EVEN") and scalar_loads > 1:  # (down: its router weight)
            print(f"  {name}: {scalar_loads} two-byte loads, where the weight tiles should load as 16-byte vectors")
            failed = 1
        if constexprs.get("PDL") and "griddepcontrol.wait" not in compiled.asm["ptx"]:
            print(f"  {name}: launched with PDL, but it never waits for the kernel before it")
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
