from mizuoto import hookimpl  # noqa: F401
