#!/usr/bin/env bash
# One GPU call that checks and times everything, within a wall budget, into one output folder.
#
#   NINFER_COMMIT=$(git rev-parse --short HEAD) bash ops/bench/gpu_call.sh OUT_DIR [BUDGET_S] [STEPS]
#
# Run from the repository root of a committed tree (results carry $NINFER_COMMIT). Wheels of
# packages the GPU machine lacks (fla-core, hydra-core, omegaconf, antlr4, pydantic-settings,
# python-dotenv) are installed from .whl/ when that folder exists. STEPS (default
# "bench_27b bench_35b kernel_tests micro") run in order, each bounded by what is left of
# BUDGET_S (default 540): the 27B bench with its speculative rows; the 35B-A3B bench with a
# cold / warm start; the compiled kernel tests; the MoE and GEMV micro-benchmarks; on request
# "probe" (ops/bench/oracle_probe.py), "spec_identity" (ops/bench/spec_identity.py), "moe_sweep"
# (moe_micro.py --sweep at SWEEP_TOKENS) and "serve_27b" / "serve_35b" (ops/bench/serve.py on a
# synthetic-weight artifact of the full shape in profile SYNTH_WEIGHTS (bf16): SERVE_S seconds, SOAK_S
# of soak, SERVE_ARGS more flags; results under OUT_DIR/27b and OUT_DIR/35b), "serve_27b_seed" (the same served
# run on a full-size seed .ninfer v3 file in the 27B groupwise-int layout, written by ops/bench/seed_synth.py to
# /tmp (~17 GB, removed after; log OUT_DIR/seed_synth.log): OUT_DIR/27b_seed/*-serve-qwen3.6-27b-seed-v3-groupwise-int.json)
# and "conversations_35b" / "conversations_27b" (serve.py's conversations
# mode on the 35B-A3B / 27B synthetic artifact: CONV_N conversations (16) over 8 lanes growing to
# CONV_HISTORY tokens (16384) in CONV_TURNS turns (4), the cold tier on GPU 1 when there is one,
# else in pinned host memory (CONV_HOST_MIB MiB; unset: the server's default, a quarter of the
# free host memory), then the same conversations with --no-cold-tier; the identity phase over
# CONV_IDENTITY conversations (9: one more than the lanes) of CONV_IDENTITY_TOKENS-token answers
# (256); CONV_S seconds (480),
# CONV_ARGS more flags;
# result under OUT_DIR/conv35b or OUT_DIR/conv27b), "prefill_graphs" (prefill_graphs.py on 10- and 8-layer 35B-A3B /
# 27B artifacts: under OUT_DIR/pg) and "compile" (run.py's torch.compile'd decode on both models,
# COMPILE_S seconds (400): under OUT_DIR/compile), "grammar_27b" / "grammar_35b" (grammar_overhead.py
# on the serve steps' synthetic artifacts: under OUT_DIR/grammar), "quant_tests" (the quantized kernels'
# tests compiled), "qgemv_micro" (the quantized GEMV's config sweep, QGEMV_ROWS), "bench_27b_q" /
# "bench_27b_fp8" / "bench_35b_q" (run.py on the groupwise-int / fp8 profile: under OUT_DIR/q), "memfit_27b"
# (memory_fit.py: the 27B groupwise-int server at 16k context and 2 lanes, peak GPU bytes), "quant_error"
# (quant_error.py: each profile against the bf16 model it encodes, 4 layers of each shape). At most
# eight files land in OUT_DIR (logs, result JSON; the 35B-A3B result under OUT_DIR/m35).
# BENCH27_ARGS / BENCH35_ARGS replace the benches' section flags (defaults: "--skip hf" and
# "--skip hf,spec --startup qwen3.6-35b-a3b"); BENCH27_S / BENCH35_S their seconds (300 / 220);
# KERNEL_TESTS_S the compiled kernel tests' (300: on a fresh machine, with no Triton cache from a
# bench before them, 200 s did not finish them).
set -u
out=${1:?usage: gpu_call.sh OUT_DIR [BUDGET_S]}
budget=${2:-540}
steps=${3:-bench_27b bench_35b kernel_tests micro}
mkdir -p "$out"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/ninfer-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/ninfer-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export NINFER_COMMIT=${NINFER_COMMIT:-unknown}

run() {  # run NAME SECONDS CMD...: bounded by the budget left, output appended to OUT/NAME.log
    local name=$1 want=$2
    shift 2
    local secs
    secs=$(left)
    [ "$secs" -gt "$want" ] && secs=$want
    if [ "$secs" -lt 30 ]; then
        echo "skipped $name: budget spent"
        return
    fi
    echo "== $name ($secs s)"
    timeout "$secs" "$@" >>"$out/$name.log" 2>&1
    echo "   rc=$? $(tail -n 1 "$out/$name.log")"
}

for step in $steps; do
    case $step in
    # shellcheck disable=SC2086  # the *_ARGS are word lists
    bench_27b) run bench_27b "${BENCH27_S:-300}" python3 ops/bench/run.py --quick --models qwen3.6-27b \
        ${BENCH27_ARGS:---skip hf} --budget-s "$(( ${BENCH27_S:-300} - 20 ))" --out "$out" ;;
    # shellcheck disable=SC2086
    bench_35b) run bench_35b "${BENCH35_S:-220}" python3 ops/bench/run.py --quick --models qwen3.6-35b-a3b \
        ${BENCH35_ARGS:---skip hf,spec --startup qwen3.6-35b-a3b} --budget-s "$(( ${BENCH35_S:-220} - 20 ))" \
        --out "$out/m35" ;;
    probe)  # does verification compute what the oracle drafted? (8-layer models, batch 1 and 8)
        run probe 150 python3 ops/bench/oracle_probe.py --model qwen3.6-27b --out "$out/probe27"
        run probe 150 python3 ops/bench/oracle_probe.py --model qwen3.6-35b-a3b --out "$out/probe35"
        ;;
    spec_identity) run spec_identity 200 python3 ops/bench/spec_identity.py --out "$out/identity" ;;
    moe_sweep) run moe_sweep 300 python3 ops/bench/moe_micro.py --sweep --tokens "${SWEEP_TOKENS:-8}" --replays 10 \
        --out "$out/sweep" ;;
    kernel_tests) run kernel_tests "${KERNEL_TESTS_S:-300}" env TRITON_INTERPRET=0 python3 -m pytest -o addopts="-q -ra" -p no:cacheprovider tests/kernels ;;
    serve_27b | serve_35b)  # the served path at full size: synthetic weights, HTTP clients, the engine beside
        shape=qwen3.6-27b
        [ "$step" = serve_35b ] && shape=qwen3.6-35b-a3b
        pkill -f ninfer.service.cli && sleep 5  # a server left by a step cut short holds the GPU
        python3 -m ninfer.artifact synth --shape "$shape" --weights "${SYNTH_WEIGHTS:-bf16}" "/tmp/$step.ninfer" \
            --force >>"$out/$step.log" 2>&1
        # shellcheck disable=SC2086  # SERVE_ARGS is a word list
        run "$step" "${SERVE_S:-280}" python3 ops/bench/serve.py "/tmp/$step.ninfer" --model "$shape" \
            --out "$out/${step#serve_}" --soak-s "${SOAK_S:-120}" ${SERVE_ARGS:-} \
            -- --max-concurrency 8 --max-context 10240 --max-pending-requests 32 ;;
    serve_27b_seed)  # the same served run on a full-size seed .ninfer v3 file (27B groupwise-int, streamed)
        pkill -f ninfer.service.cli && sleep 5  # a server left by a step cut short holds the GPU
        run seed_synth 300 python3 ops/bench/seed_synth.py --shape qwen3.6-27b /tmp/seed_27b.ninfer --force
        # shellcheck disable=SC2086  # SERVE_ARGS is a word list
        [ -f /tmp/seed_27b.ninfer ] && run "$step" "${SERVE_S:-280}" python3 ops/bench/serve.py /tmp/seed_27b.ninfer \
            --model qwen3.6-27b --out "$out/27b_seed" --soak-s "${SOAK_S:-120}" ${SERVE_ARGS:-} \
            -- --max-concurrency 8 --max-context 10240 --max-pending-requests 32
        rm -f /tmp/seed_27b.ninfer ;;
    conversations_35b | conversations_27b)  # restores from the cold tier against re-prefills, same histories
        shape=qwen3.6-35b-a3b
        [ "$step" = conversations_27b ] && shape=qwen3.6-27b
        pkill -f ninfer.service.cli && sleep 5  # a server left by a step cut short holds the GPU
        python3 -m ninfer.artifact synth --shape "$shape" "/tmp/$step.ninfer" --force >>"$out/$step.log" 2>&1
        history=${CONV_HISTORY:-16384}
        context=$((history + 2048))  # the KV pool holds every lane's full history: lanes, not pages, evict
        tier=""  # the tier's arena on the second GPU; on one GPU the server parks in pinned host memory
        if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
            tier="--cold-tier-device 1"
        elif [ -n "${CONV_HOST_MIB:-}" ]; then
            tier="--cold-tier-host-mib $CONV_HOST_MIB"
        fi
        # shellcheck disable=SC2086  # CONV_ARGS and tier are word lists
        run "$step" "${CONV_S:-480}" python3 ops/bench/serve.py "/tmp/$step.ninfer" --model "$shape" \
            --out "$out/conv${step#conversations_}" --conversations "${CONV_N:-16}" --turns "${CONV_TURNS:-4}" \
            --history-tokens "$history" --compare-no-cold-tier \
            --identity-conversations "${CONV_IDENTITY:-9}" --identity-tokens "${CONV_IDENTITY_TOKENS:-256}" \
            --skip first,c1,c8,c32,poisson,lengths,multi_turn,soak,engine ${CONV_ARGS:-} \
            -- --max-concurrency 8 --max-context "$context" --kv-capacity $((8 * context)) \
            --max-pending-requests 32 --pending-timeout-ms 300000 $tier ;;  # 16 long first turns queue
    prefill_graphs)  # short prefills eager / one row per replay / grouped, and a burst of 8 (reduced depth)
        run prefill_graphs 150 python3 ops/bench/prefill_graphs.py --shape qwen3.6-35b-a3b --layers 10 --out "$out/pg"
        run prefill_graphs 150 python3 ops/bench/prefill_graphs.py --shape qwen3.6-27b --layers 8 --out "$out/pg"
        ;;
    grammar_27b | grammar_35b)  # grammar masks at batch 8 on the full-size step, compile time per schema
        shape=qwen3.6-27b
        [ "$step" = grammar_35b ] && shape=qwen3.6-35b-a3b
        [ -d "/tmp/serve_${step#grammar_}.ninfer" ] ||
            python3 -m ninfer.artifact synth --shape "$shape" "/tmp/serve_${step#grammar_}.ninfer" --force >>"$out/$step.log" 2>&1
        run "$step" 240 python3 ops/bench/grammar_overhead.py "/tmp/serve_${step#grammar_}.ninfer" --model "$shape" \
            --out "$out/grammar" ;;
    compile)  # the torch.compile'd decode step against the eager one (graph breaks, compile errors)
        run compile "${COMPILE_S:-400}" python3 ops/bench/run.py --quick --models qwen3.6-35b-a3b,qwen3.6-27b \
            --compile qwen3.6-35b-a3b,qwen3.6-27b --skip eager,ttft,prefill,int8,spec,hf \
            --budget-s "$(( ${COMPILE_S:-400} - 20 ))" --out "$out/compile" ;;
    quant_tests)  # the quantized GEMV, MoE experts and model steps, compiled (TRITON_INTERPRET=0)
        run quant_tests "${QUANT_TESTS_S:-240}" env TRITON_INTERPRET=0 python3 -m pytest -o addopts="-q -ra -x" -p no:cacheprovider \
            tests/kernels/test_qgemv.py tests/kernels/test_qmoe.py tests/kernels/test_triton_backend.py ;;
    qgemv_micro)  # the quantized GEMV's config sweep on the 27B / 35B-A3B decode projections
        run qgemv_micro "${QGEMV_S:-300}" python3 ops/bench/qgemv_micro.py --out "$out" --rows "${QGEMV_ROWS:-1,8}" ${QGEMV_ARGS:-} ;;
    bench_27b_q | bench_27b_fp8 | bench_35b_q)  # run.py on a quantized profile (decode, prefill, memory)
        shape=qwen3.6-27b profile=groupwise-int
        [ "$step" = bench_27b_fp8 ] && profile=fp8
        [ "$step" = bench_35b_q ] && shape=qwen3.6-35b-a3b
        # shellcheck disable=SC2086
        run "$step" "${BENCHQ_S:-240}" python3 ops/bench/run.py --quick --models "$shape" --weights "$profile" \
            ${BENCHQ_ARGS:---skip hf,spec,int8,eager,compiled} --budget-s "$(( ${BENCHQ_S:-240} - 20 ))" --out "$out/q" ;;
    quant_error)  # top-1 agreement and KL of each profile against the bf16 model it encodes (4 layers)
        run quant_error 150 python3 ops/bench/quant_error.py --shape qwen3.6-27b --out "$out/q"
        run quant_error 150 python3 ops/bench/quant_error.py --shape qwen3.6-35b-a3b --out "$out/q"
        ;;
    memfit_27b)  # the 27B groupwise-int server's GPU memory at 16k context, 2 lanes (the 24 GB target)
        run memfit_27b 240 python3 ops/bench/memory_fit.py --shape qwen3.6-27b --weights groupwise-int --out "$out/q" ${MEMFIT_ARGS:-} \
            -- --max-context 16384 --max-concurrency 2 ;;
    micro)
        run micro 90 python3 ops/bench/moe_micro.py --out "$out"
        run micro 60 python3 ops/bench/gemv_micro.py --out "$out"
        ;;
    *) echo "unknown step $step (quant_tests qgemv_micro quant_error bench_27b_q bench_27b_fp8 bench_35b_q memfit_27b bench_27b bench_35b serve_27b serve_35b serve_27b_seed conversations_35b conversations_27b prefill_graphs grammar_27b grammar_35b compile probe spec_identity moe_sweep kernel_tests micro)" ;;
    esac
done
echo "done in $(($(date +%s) - start)) s"
