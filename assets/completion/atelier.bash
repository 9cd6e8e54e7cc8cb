# bash completion for atelier (installed as
# /usr/share/bash-completion/completions/atelier). Subcommands and flags are
# read from the program's own --help, so they are always the installed
# version's; -m/--model and REF arguments complete the store's model names.
_atelier_help_words() {
  # $1...: the subcommand path. Prints its subcommands and its flags.
  "${COMP_WORDS[0]}" "$@" --help 2>/dev/null | awk '
    /^Subcommands:/ { sub_ = 1; next }
    /^[A-Za-z]/      { sub_ = 0 }
    sub_ && /^  [a-z]/ { print $1; next }
    { for (i = 1; i <= NF; i++) if ($i ~ /^-/) { n = split($i, parts, ","); for (j = 1; j <= n; j++) if (parts[j] ~ /^-/) { w = parts[j]; sub(/[=\[].*/, "", w); print w } } }' | sort -u
}

_atelier_models() {
  "${COMP_WORDS[0]}" models list --json 2>/dev/null | grep -o '"name":"[^"]*"' | cut -d'"' -f4 | sort -u
}

_atelier() {
  local cur prev path=() i w
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    -m|--model|--image-model) mapfile -t COMPREPLY < <(compgen -W "$(_atelier_models)" -- "$cur"); compopt -o filenames 2>/dev/null
                              COMPREPLY+=($(compgen -f -- "$cur")); return ;;
    -o|--out|--data-dir|--store|--mirror|--catalog|--init|--mask|--tokenizer|--taesd|--preview-dir|--models-dir|--batch|--template|--messages|--text)
      compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
    --kv-type) mapfile -t COMPREPLY < <(compgen -W "f16 f32 q8_0" -- "$cur"); return ;;
    --sampler) mapfile -t COMPREPLY < <(compgen -W "euler euler_a heun dpmpp_2m ddim lcm" -- "$cur"); return ;;
    --scheduler) mapfile -t COMPREPLY < <(compgen -W "discrete karras" -- "$cur"); return ;;
  esac
  # The subcommand path so far: the words before this one that are subcommands.
  local words
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    [[ $w == -* ]] && continue
    words=$(_atelier_help_words "${path[@]}")
    if grep -qx -- "$w" <<<"$words"; then path+=("$w"); fi
  done
  words=$(_atelier_help_words "${path[@]}")
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(grep -- '^-' <<<"$words")" -- "$cur")
  else
    mapfile -t COMPREPLY < <(compgen -W "$(grep -v -- '^-' <<<"$words")" -- "$cur")
    case ${path[*]} in
      "models info"|"models verify"|"models promote"|"models rollback"|"models remove"|"models history"|"models quantize"|"models compare")
        COMPREPLY+=($(compgen -W "$(_atelier_models)" -- "$cur")) ;;
      batch|"batch merge"|"models import"|"models scan") compopt -o filenames 2>/dev/null; COMPREPLY+=($(compgen -f -- "$cur")) ;;
    esac
  fi
}
complete -F _atelier atelier
