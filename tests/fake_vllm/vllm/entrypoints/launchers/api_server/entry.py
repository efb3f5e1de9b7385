"""The stand-in vLLM server entry point (tests/fake_vllm/README.md): serves tests/sampling/stand_in.StandIn at
--port until SIGTERM; every other vLLM flag is accepted and ignored."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from tests.sampling.stand_in import StandIn

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
args, _ = parser.parse_known_args()
server = StandIn(args.port)
devices = os.environ.get("CUDA_VISIBLE_DEVICES")
print(f"stand-in vLLM server on port {args.port}, CUDA_VISIBLE_DEVICES={devices}", flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
done.wait()
server.kill()
