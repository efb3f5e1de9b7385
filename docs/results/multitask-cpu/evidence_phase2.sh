#!/bin/bash
# issue 22 evidence, continued (evidence.sh ran phase 1's launch; its bash was stopped to shorten phase 2)
set -x
cd /work/wt-evid
PY=.venv/bin/python
MIX="('random-acts-of-pizza','spooky-author-identification','detecting-insults-in-social-commentary','nomad2018-predict-transparent-conductors')"
W=runs/multitask-evidence
COMMON=(--config=configs/multitask.py:cpu "--config.tasks=$MIX" --config.warmstart.steps=600 --config.eval.samples=32 --config.warmstart.verify_timeout_s=600 --config.workdir=$W)
while kill -0 10293 2>/dev/null; do sleep 5; done
test -f $W/evaluation.json || exit 1
date -u +%FT%TZ > /work/logs/evid_t1
cp $W/evaluation.json $W/evaluation-before.json; cp $W/report.md $W/report-before.md
$PY -m mle_jax.evaluate --workdir $W --samples 32 --task leaf-classification || exit 2
mv $W/evaluation-leaf-classification.json $W/evaluation-leaf-classification-before.json
date -u +%FT%TZ > /work/logs/evid_t2
$PY -m mle_jax.launch "${COMMON[@]}" --config.loop.steps=12 || exit 3
date -u +%FT%TZ > /work/logs/evid_t3
$PY -m mle_jax.evaluate --workdir $W --samples 32 --task leaf-classification || exit 4
date -u +%FT%TZ > /work/logs/evid_t4
echo done
