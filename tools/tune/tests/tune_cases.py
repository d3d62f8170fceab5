"""What the comet-tune tests on synthetic records share: the records written as JSON files, a table's
entries by token count, and the comparison with the expected picks (printed where they differ)."""
import json
import os


def write_records(directory, named):
    """Writes each {name: records} list to directory/name.json; returns {name: path}."""
    paths = {}
    for name, records in named.items():
        paths[name] = os.path.join(directory, name + ".json")
        with open(paths[name], "w") as f:
            json.dump(records, f)
    return paths


def entries_by_tokens(table, fields):
    """{token field of the key ("T4096"): fields(entry)} for every entry of the table file."""
    with open(table) as f:
        entries = json.load(f)["entries"]
    return {key.split("|")[-2]: fields(e) for key, e in entries.items()}


def matches(what, got, expected):
    """True where got is expected; else prints both under `what`."""
    if got != expected:
        print(f"{what} {got}, expected {expected}")
    return got == expected
