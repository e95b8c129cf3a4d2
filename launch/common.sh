# shellcheck shell=bash
# What the launch scripts share, sourced by them after they set PROG (their name in errors):
# the bash version check, one-line errors, option checks and shell quoting.

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
