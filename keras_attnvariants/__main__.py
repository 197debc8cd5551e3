"""Command line: `python -m keras_attnvariants demo [--quick | --full]`."""

import argparse
import sys

COMMANDS = ("demo",)


class OneLineParser(argparse.ArgumentParser):
    """Reports a bad flag or value in one line and exits with status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def variant_list(text):
    from keras_attnvariants.demo import VARIANTS

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {unknown or text!r}; choose from "
            f"{','.join(VARIANTS)}"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"variant(s) {repeated} given twice")
    return tuple(names)


def folder(text):
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder, got ''")
    return text


def parse(argv):
    parser = OneLineParser(
        prog="python -m keras_attnvariants",
        description="keras_attnvariants command line.",
    )
    commands = parser.add_subparsers(dest="command", parser_class=OneLineParser)
    demo = commands.add_parser(
        "demo",
        help="fine-tune MiniLM with every variant and compare them",
        description="Fine-tunes the pretrained MiniLM on Rotten Tomatoes "
        "with each attention variant and compares them.",
    )
    size = demo.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="about a minute (CI)"
    )
    size.add_argument(
        "--full", action="store_true", help="larger run (tens of minutes)"
    )
    demo.add_argument(
        "--variants",
        type=variant_list,
        default=None,
        help="comma-separated subset of the variants",
    )
    demo.add_argument(
        "--output",
        type=folder,
        default="demo_outputs",
        help="folder for plots and tables",
    )
    demo.add_argument(
        "--export-dir",
        type=folder,
        default=None,
        help="SavedModel folder (default saved_models/demo_best)",
    )
    demo.add_argument(
        "--seed", type=int, default=0, help="data seed (int >= 0)"
    )
    demo.add_argument(
        "--jit-compile", action="store_true", help="compile steps with XLA"
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(f"missing command; choose from {', '.join(COMMANDS)}")
    # NumPy's generators take seeds >= 0 only.
    if args.command == "demo" and args.seed < 0:
        demo.error(f"argument --seed: must be an int >= 0, got {args.seed}")
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    from keras_attnvariants import demo

    size = "quick" if args.quick else "full" if args.full else "default"
    summary = demo.run(
        size=size,
        variants=args.variants or demo.VARIANTS,
        output=args.output,
        seed=args.seed,
        jit_compile=args.jit_compile,
        export_dir=args.export_dir,
    )
    return 0 if summary["reload_parity"] else 1


if __name__ == "__main__":
    sys.exit(main())
