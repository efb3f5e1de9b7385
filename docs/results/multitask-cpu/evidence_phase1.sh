#!/bin/bash
# issue 22 evidence: configs/multitask.py:cpu over pizza, spooky, insults, nomad2018; leaf held out
# As run (07:33 UTC; restarted at 08:06 with the verification timeout below after one spooky corpus program hit
# 120 s on the loaded machine). Its bash was stopped after this first launch; evidence_phase2.sh ran the rest
# with 12 RL steps instead of the 20 this script went on to ask for (lines removed: they never ran).
set -x
cd /work/wt-evid
PY=.venv/bin/python
MIX="('random-acts-of-pizza','spooky-author-identification','detecting-insults-in-social-commentary','nomad2018-predict-transparent-conductors')"
W=runs/multitask-evidence
COMMON=(--config=configs/multitask.py:cpu "--config.tasks=$MIX" --config.warmstart.steps=600 --config.eval.samples=32 --config.warmstart.verify_timeout_s=600 --config.workdir=$W)
date -u +%FT%TZ > /work/logs/evid_t0
$PY -m mle_jax.launch "${COMMON[@]}" --config.loop.steps=0 || exit 1
date -u +%FT%TZ > /work/logs/evid_t1
