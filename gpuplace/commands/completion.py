"""`gpuplace completion bash|zsh`: a shell completion script for this command line.

    source <(gpuplace completion bash)      # bash; or save it in /etc/bash_completion.d/gpuplace
    source <(gpuplace completion zsh)       # zsh (through bashcompinit)

It completes the subcommands (those the development environment adds too, where installed), their
verbs and flags, and the values of flags with fixed choices (`-o json`). Written from the parser,
so it always matches the installed command line.
"""

from __future__ import annotations

import argparse
import shlex

from gpuplace.commands._args import documented_command

SHELLS = ("bash", "zsh")
#: Its script is written from every subcommand's parser (gpuplace/cli.py).
WHOLE_COMMAND_LINE = True


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = documented_command(subparsers, "completion", "print a shell completion script", __doc__)
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(handler=run)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings)


def _choices(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Flag -> its fixed values (flags with `choices`)."""
    out: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.option_strings and action.choices is not None:
            for option in action.option_strings:
                out[option] = [str(c) for c in action.choices]
    return out


def _words(items: list[str]) -> str:
    return shlex.quote(" ".join(items))


def bash_script(root: argparse.ArgumentParser) -> str:
    commands = _subcommands(root)
    cases: list[str] = []
    for name, sub in sorted(commands.items()):
        verbs = _subcommands(sub)
        values = [
            f'            {flag}) COMPREPLY=($(compgen -W {_words(vals)} -- "$cur")); return;;'
            for flag, vals in sorted(_choices(sub).items())
        ]
        positional = [
            str(c) for a in sub._actions if not a.option_strings and a.choices for c in a.choices
        ]
        first = sorted(verbs) or positional
        lines = [f"        {name})"]
        if values:
            lines += ['            case "$prev" in', *values, "            esac"]
        if first:
            lines += [
                '            if [[ "$cur" != -* && $COMP_CWORD -eq 2 ]]; then',
                f'                COMPREPLY=($(compgen -W {_words(first)} -- "$cur")); return',
                "            fi",
            ]
        lines.append(
            f'            COMPREPLY=($(compgen -W {_words(_options(sub))} -- "$cur")); return;;'
        )
        cases.append("\n".join(lines) + "\n")
    top = _words([*sorted(commands), *_options(root)])
    return (
        "# bash completion for gpuplace (gpuplace completion bash)\n"
        "_gpuplace() {\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"\n'
        "    COMPREPLY=()\n"
        "    if [[ $COMP_CWORD -eq 1 ]]; then\n"
        f'        COMPREPLY=($(compgen -W {top} -- "$cur")); return\n'
        "    fi\n"
        '    case "${COMP_WORDS[1]}" in\n' + "".join(cases) + "    esac\n"
        "}\n"
        "complete -F _gpuplace gpuplace\n"
    )


def zsh_script(root: argparse.ArgumentParser) -> str:
    return (
        "#compdef gpuplace\n"
        "# zsh completion for gpuplace (gpuplace completion zsh): the bash function, through\n"
        "# zsh's bashcompinit\n"
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(root)
    )


def run(args: argparse.Namespace) -> int:
    root: argparse.ArgumentParser = args.root_parser
    print(bash_script(root) if args.shell == "bash" else zsh_script(root), end="")
    return 0
