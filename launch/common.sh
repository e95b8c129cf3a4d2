# shellcheck shell=bash disable=SC2034  # EXTRA_ARGS and DEFAULT_REPO are read by the scripts
# What the launch scripts share, sourced by them first: their name and repository, the bash
# version check, one-line errors, option parsing and checks, and shell quoting.

# The sourcing script's name (in its errors) and the repository it belongs to (launch/..).
readonly PROG="${BASH_SOURCE[1]##*/}"
DEFAULT_REPO="$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)"
readonly DEFAULT_REPO

if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 404)); then
  echo "$PROG: error: needs bash >= 4.4 (this is $BASH_VERSION)" >&2
  exit 2
fi

die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  exit 2
}

# One shell word per argument, in the form Python's shlex.quote gives: bare when made only of
# safe characters, otherwise in single quotes. Hand-written because printf %q escapes with
# backslashes and ${var@Q} quotes every word, both hard to read in the printed commands.
quote_words() {
  local word out=()
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+=("$word")
    else
      out+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  printf '%s' "${out[*]}"
}

require_value() {  # OPTION [VALUE ...]: the value that follows OPTION must be present.
  if (($# < 2)) || [[ -z $2 || $2 == --* ]]; then
    die "option $1 needs a value (see --help)"
  fi
}

# check_main_args CONFIG [ARGS...]: CONFIG is relative to the repository, and no ARG (what follows
# -- for cl_jax.main) is a flag that the scripts set themselves.
check_main_args() {
  if [[ $1 == /* ]]; then
    die "--config '$1' must be relative to the repository, e.g. configs/mocov2_patchns.py"
  fi
  shift
  local arg
  for arg in "$@"; do
    case $arg in
      --config | --config=* | --workdir | --workdir=* | --multihost | --nomultihost)
        die "'$arg' after -- is set by this script: use its --config / --workdir options"
        ;;
    esac
  done
}

# parse_options "VALUE_OPTIONS" "FLAG_OPTIONS" ARGS...: for each option given, sets the variable of
# its name (--gpus-per-node sets GPUS_PER_NODE): a value option to its value (--opt V or
# --opt=V), a flag option to true. Words after -- go to EXTRA_ARGS, other words to POSITIONAL;
# -h/--help prints usage and exits; an unknown option or a missing value ends in one line.
parse_options() {
  local values=" $1 " switches=" $2 " arg option
  shift 2
  POSITIONAL=()
  while (($# > 0)); do
    arg=$1
    shift
    if [[ $arg == --*=* ]]; then
      set -- "${arg#*=}" "$@"
      arg=${arg%%=*}
    fi
    option=${arg#--}
    option=${option//-/_}
    if [[ $arg == -h || $arg == --help ]]; then
      usage
      exit 0
    elif [[ $arg == -- ]]; then
      EXTRA_ARGS=("$@")
      break
    elif [[ $arg == --* && $values == *" ${arg#--} "* ]]; then
      require_value "$arg" "$@"
      printf -v "${option^^}" '%s' "$1"
      shift
    elif [[ $arg == --* && $switches == *" ${arg#--} "* ]]; then
      printf -v "${option^^}" '%s' true
    elif [[ $arg == -* ]]; then
      die "unknown option '$arg' (see --help)"
    else
      POSITIONAL+=("$arg")
    fi
  done
}

# print_batch_plan PYTHON CONFIG CHIPS [ARGS...]: the run's per-chip batch, global batch and
# learning rate on CHIPS chips (python -m cl_jax.batch_plan, run by PYTHON in this checkout;
# the --config.* ARGS apply), on stderr; where PYTHON cannot run it, the command that would.
print_batch_plan() {
  local python=$1 config=$2 chips=$3 arg out err root
  shift 3
  local overrides=()
  for arg in "$@"; do
    if [[ $arg == --config.* ]]; then overrides+=("$arg"); fi
  done
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  # The plan is the command's output; its log lines (a library's start-up notices) stay out of
  # it, and the last of them names the reason where the command fails.
  err=$(mktemp)
  if out=$(cd "$root" && "$python" -m cl_jax.batch_plan --config="$config" --chips="$chips" "${overrides[@]}" 2>"$err"); then
    printf 'batch plan: %s\n' "$out" >&2
  else
    printf 'batch plan: not computed here (%s): python -m cl_jax.batch_plan --config=%s --chips=%s\n' \
      "$(tail -n 1 "$err")" "$config" "$chips" >&2
  fi
  rm -f "$err"
}

# add_batch_per_chip: with --batch-per-chip N, checks N and appends
# --config.optim.batch_per_chip=N to EXTRA_ARGS (what follows -- for cl_jax.main).
add_batch_per_chip() {
  [[ -n $BATCH_PER_CHIP ]] || return 0
  [[ $BATCH_PER_CHIP =~ ^[1-9][0-9]*$ ]] || die "--batch-per-chip '$BATCH_PER_CHIP' must be a positive integer"
  local arg
  for arg in "${EXTRA_ARGS[@]}"; do
    if [[ $arg == --config.optim.batch_per_chip=* ]]; then
      die "'$arg' after -- and --batch-per-chip both set the batch per chip: give one"
    fi
  done
  EXTRA_ARGS+=("--config.optim.batch_per_chip=$BATCH_PER_CHIP")
}

# For a GPU machine without network (gpu_report.sh, gpu_study.sh), run from the repository's
# root: the wheels carried in .whl/ (launch/gpu_wheels.sh) installed into a folder of their own,
# put on PYTHONPATH with the repository; then every MODULE must import with PYTHON, or one line
# says what to do.
use_carried_wheels() {  # PYTHON MODULE...
  local python="$1" site imports
  shift
  if compgen -G ".whl/*.whl" >/dev/null; then
    site="${TMPDIR:-/tmp}/cl_jax_site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .whl/*.whl
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  imports=$(IFS=,; echo "$*")
  "$python" -c "import $imports" 2>/dev/null ||
    die "cl_jax's packages do not import with $python; run launch/gpu_wheels.sh where there is a network and carry .whl/"
}
