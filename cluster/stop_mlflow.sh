#!/usr/bin/env bash
# Stop the head's MLflow tracking server and its workers (its whole process group).
set -u
[ -f ~/mlflow.pid ] || exit 0
kill -- "-$(cat ~/mlflow.pid)" 2>/dev/null
for _ in $(seq 20); do
  kill -0 -- "-$(cat ~/mlflow.pid)" 2>/dev/null || break
  sleep 0.5
done
kill -9 -- "-$(cat ~/mlflow.pid)" 2>/dev/null
rm -f ~/mlflow.pid
exit 0
