# bash completion for muster, musterd and musterctl. The options come from
# each binary's own --help (read once per shell), so this file never lists
# them and never falls behind. Install as
# /usr/share/bash-completion/completions/{muster,musterd,musterctl}.

# The long options a binary's --help names (both spellings, as printed).
_muster_options() {
  local bin=$1 var="_muster_opts_${1//[^a-zA-Z0-9]/_}"
  if [[ -z ${!var+set} ]]; then
    printf -v "$var" '%s' "$("$bin" --help 2>/dev/null | grep -oE -- '--[a-z][a-z0-9_-]*' | sort -u | tr '\n' ' ')"
  fi
  printf '%s' "${!var}"
}

_muster() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} i
  COMPREPLY=()
  # After the training script, everything belongs to it: complete files.
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      --*=* | -[rt]?*) ;;
      --nnodes | --nproc[-_]per[-_]node | --rdzv[-_]* | --max[-_]restarts | --monitor[-_]interval | \
      --start[-_]method | --event[-_]log[-_]handler | --role | --log[-_]dir | -r | --redirects | -t | --tee | \
      --local[-_]ranks[-_]filter | --duplicate[-_]std*[-_]filters | --node[-_]rank | --master[-_]addr | \
      --master[-_]port | --local[-_]addr | --logs[-_]specs | --numa[-_]binding | --signals[-_]to[-_]handle | \
      --shutdown[-_]timeout | --auth[-_]key[-_]file | --metrics[-_]listen | --worker[-_]timeout | \
      --health[-_]check | --health[-_]check[-_]timeout | --health[-_]check[-_]interval | --exclude[-_]exit[-_]code | \
      --hostfile | --hosts | --include | --exclude | \
      --export | --from[-_]launcher) ((i++)) ;;
      -*) ;;
      *) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    esac
  done
  case $prev in
    --nproc-per-node | --nproc_per_node) COMPREPLY=($(compgen -W "auto cpu gpu" -- "$cur")); return ;;
    --rdzv-backend | --rdzv_backend) COMPREPLY=($(compgen -W "static c10d" -- "$cur")); return ;;
    --start-method | --start_method) COMPREPLY=($(compgen -W "spawn fork forkserver" -- "$cur")); return ;;
    --numa-binding | --numa_binding) COMPREPLY=($(compgen -W "node socket exclusive core-complex" -- "$cur")); return ;;
    --log-dir | --log_dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --auth-key-file | --auth_key_file | --hostfile) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_muster_options "${COMP_WORDS[0]}")" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}

_musterd() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  COMPREPLY=()
  case $prev in
    --auth-key-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  COMPREPLY=($(compgen -W "$(_muster_options "${COMP_WORDS[0]}")" -- "$cur"))
}

_musterctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} i sub=
  COMPREPLY=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      jobs | job) sub=${COMP_WORDS[i]} ;;
    esac
  done
  case $prev in
    --auth-key-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --endpoint | --timeout) return ;;
  esac
  if [[ $cur == -* || -n $sub ]]; then
    COMPREPLY=($(compgen -W "$(_muster_options "${COMP_WORDS[0]}")" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "jobs job" -- "$cur"))
  fi
}

complete -F _muster -o filenames muster
complete -F _musterd musterd
complete -F _musterctl musterctl
