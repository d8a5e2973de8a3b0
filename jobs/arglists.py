"""Changing a program's argument list the way a person edits a command line: an option given
again takes the place of the one already there instead of being appended after it.

Used for the arguments a job's later attempts run with (`restart.args_on_resume`) and for the
values an experiment's trial tries. An option is `--name=value`, `--name value` (the next item,
when it does not itself start with `-`), or a bare `--name`; anything else is a positional
argument. argparse lets the last of a repeated option win, but not every program parses with
argparse (nanoGPT's configurator reads `--key=value` items in order, and a stray copy of an
option can be an error), so a replaced option is removed, not shadowed.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One option or positional argument, as the items of the list that spell it."""

    name: str  # "--lr" for an option; "" for a positional argument
    words: tuple[str, ...]


def _is_option(word: str) -> bool:
    # "-" alone means standard input and "-1" is a negative number, not an option.
    return word.startswith("-") and len(word) > 1 and not _is_number(word)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def items(args: list[str]) -> list[Item]:
    """The list read as options and positional arguments, in order."""
    found: list[Item] = []
    position = 0
    while position < len(args):
        word = args[position]
        if word == "--":  # everything after it is positional, as for argparse
            found.extend(Item("", (rest,)) for rest in args[position:])
            break
        if not _is_option(word):
            found.append(Item("", (word,)))
            position += 1
            continue
        name, equals, _ = word.partition("=")
        following = args[position + 1] if position + 1 < len(args) else None
        if not equals and following is not None and not _is_option(following) and following != "--":
            found.append(Item(name, (word, following)))
            position += 2
        else:
            found.append(Item(name, (word,)))
            position += 1
    return found


def merge(args: list[str], changes: list[str]) -> list[str]:
    """`args` with each option of `changes` in place of the same option (every copy of it), or
    added at the end; a positional argument of `changes` is added at the end unless `args`
    already has it."""
    result = items(args)
    for change in items(changes):
        if not change.name:
            if not any(item.words == change.words for item in result):
                result.append(change)
            continue
        where = next((i for i, item in enumerate(result) if item.name == change.name), None)
        result = [item for item in result if item.name != change.name]
        result.insert(len(result) if where is None else where, change)
    return [word for item in result for word in item.words]


def set_option(args: list[str], name: str, value: str) -> list[str]:
    """`args` with the option `name` set to `value`, written the way the list already writes
    it (`--lr=0.1` stays in that form; `--lr 0.1` or a new option as two items). A value that
    reads as an option itself (`-x`) is always joined with `=`, or it would not be its value."""
    if _is_option(value):
        return merge(args, [f"{name}={value}"])
    for item in items(args):
        if item.name == name and len(item.words) == 1 and "=" in item.words[0]:
            return merge(args, [f"{name}={value}"])
    return merge(args, [name, value])
