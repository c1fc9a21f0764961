# bench/lib/serval_variant.sh: sourced by bench/cpu_split and bench/hog_mix.
# A variant is NAME=ROOT[:VAR=VALUE,VAR=VALUE]: a Serval checkout with its
# extension built, started with those environment variables.

# variant_start VARIANT PORT APP LOG [ARGS...]: starts the variant on CPU 0
# (1 process x $THREADS threads) in the background; sets VARIANT_NAME and
# VARIANT_PID (bundle exec execs ruby: the server's pid).
variant_start() {
  local variant=$1 port=$2 app=$3 log=$4
  shift 4
  VARIANT_NAME=${variant%%=*}
  local spec=${variant#*=} root envs=""
  root=${spec%%:*}
  [ "$spec" != "$root" ] && envs=${spec#*:}
  root=$(cd "$root" && pwd)
  (
    IFS=,
    for e in $envs; do export "${e?}"; done
    unset IFS
    exec taskset -c 0 bundle exec ruby -I "$root/lib" "$root/exe/serval" -q -e production \
      -b "tcp://127.0.0.1:$port" -t "$THREADS:$THREADS" "$@" "$app"
  ) >"$log" 2>&1 &
  VARIANT_PID=$!
}

# wait_up URL: until it answers (15 s at most); 1 if it never did.
wait_up() {
  for _ in $(seq 1 150); do
    curl -fs "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
