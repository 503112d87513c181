"""What the tests of scripts/gpu_check share: the program's package on the
path, and made-up run directories and worker logs."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


@pytest.fixture
def run_dir(tmp_path):
    """run_dir(name, losses, tokens_per_s, flops_per_token): a worker run
    directory whose metrics.jsonl logs those losses, step 1 on."""
    def make(name, losses, tokens_per_s=1000.0, flops_per_token=6e8):
        d = tmp_path / name
        d.mkdir()
        with open(d / "metrics.jsonl", "w") as f:
            for i, loss in enumerate(losses):
                f.write(json.dumps({"step": i + 1, "loss": loss, "tokens_per_s": tokens_per_s + i,
                                    "model_flops_per_s": (tokens_per_s + i) * flops_per_token}) + "\n")
        return str(d)
    return make


# The lines of a worker's log on a GPU as launch/run_log.cc and
# kernels/nn/attention.cc print them.
MODEL_LINE = ("model: GPT of 124475904 parameters, 12 layers; CUDA kernels, attention: cuDNN fused attention "
              "(bf16 q, k, v, fp32 statistics); loss in chunks of 1024 rows")
ENGINE_LINE = ("engine: FULL_SHARD, bf16_master; 1 rank(s) x 16 thread(s), 1 micro-batch(es) per rank per step, "
               "16.4K tokens per step")


def worker_log(ops, model_line=MODEL_LINE):
    return (f"{model_line}\n{ENGINE_LINE}\ndevice (rank 0): cuda:0 (NVIDIA H100), data plane NCCL\nstep 1 ...\n"
            f"ops per step (rank 0): {ops} (model {ops - 40}, engine 40)\n"
            "  gemm plan: 4096 x 2304 x 768, bf16 x bf16 -> bf16, bias: fused in cuBLASLt's epilogue, "
            "algorithm 21 of 8, 512.5 TFLOP/s (cuda:0)\n"
            "  gemm plan: 4096 x 3072 x 768, bf16 x bf16^T -> bf16, dgelu: packed to fp32 (A, B), "
            "product, then kernels, algorithm 6 of 8, 401 TFLOP/s (cuda:0)\n"
            "  gemm plan: 4096 x 768 x 768, bf16 x bf16 -> fp32, bias, addend: fused in cuBLASLt's "
            "epilogue, algorithm 3 of 1, not timed (cuda:0)\n"
            "step 3 ...\nops per step (rank 0): 999 (model 1, engine 998)\n")
