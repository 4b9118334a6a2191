#!/usr/bin/env bash
# The head's MLflow tracking server (head_setup_commands of the recipes): started once, on
# the head's cluster address (RAYCOBO_MLFLOW_HOST; default its first address) and port
# (RAYCOBO_MLFLOW_PORT; default 5000), in a process group of its own; this waits until it
# answers (at most 120 s), so runs submitted right after `ray up` are tracked.
# Reach it from your machine through SSH: ssh -L 5000:<head address>:5000 <user>@<head>
# Stop it before `ray down`: ray exec CLUSTER.yaml '~/raycobo/cluster/stop_mlflow.sh'
set -u
HOST=${RAYCOBO_MLFLOW_HOST:-$(hostname -I | cut -d' ' -f1)}
PORT=${RAYCOBO_MLFLOW_PORT:-5000}
if [ -f ~/mlflow.pid ] && kill -0 "$(cat ~/mlflow.pid)" 2>/dev/null; then
  exit 0
fi
setsid nohup ~/raycobo-env/bin/mlflow server --backend-store-uri "sqlite:///$HOME/mlflow.db" \
  --artifacts-destination "$HOME/mlartifacts" --host "$HOST" --port "$PORT" \
  > ~/mlflow.log 2>&1 < /dev/null &
echo $! > ~/mlflow.pid
for _ in $(seq 120); do
  (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null && exit 0
  sleep 1
done
echo "MLflow server did not answer on $HOST:$PORT within 120 s; see ~/mlflow.log" >&2
exit 1
