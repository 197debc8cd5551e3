"""Command line: `python -m keras_attnvariants demo [--quick | --full]`."""

import argparse
import os
import sys

from keras_attnvariants._argparse_types import folder

# TensorFlow's C++ start-up logs are quieted by `keras_attnvariants._startup`
# (the package import, which `python -m` runs first, starts TensorFlow).

COMMANDS = ("demo",)
# NumPy's legacy seeding and `keras.utils.set_random_seed` take 32 bits.
MAX_SEED = 2**32 - 1
# Where the demo exports its best model (as `demo.run` does by default).
DEFAULT_EXPORT_DIR = os.path.join("saved_models", "demo_best")


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


def positive_int(text):
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


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
        # A string, so that argparse checks the default with `folder` too.
        default=DEFAULT_EXPORT_DIR,
        help=f"SavedModel folder (default {DEFAULT_EXPORT_DIR})",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help=f"data seed (int in [0, {MAX_SEED}])",
    )
    demo.add_argument(
        "--jit-compile", action="store_true", help="compile steps with XLA"
    )
    demo.add_argument(
        "--cpu-replicas",
        type=positive_int,
        default=None,
        metavar="N",
        help="without accelerators: a MirroredStrategy over N logical CPU "
        "devices (not with --jit-compile)",
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(f"missing command; choose from {', '.join(COMMANDS)}")
    if (
        args.command == "demo"
        and args.jit_compile
        and (args.cpu_replicas or 1) > 1
    ):
        demo.error(
            "argument --cpu-replicas: XLA (--jit-compile) cannot run a "
            "MirroredStrategy over logical CPU devices"
        )
    if args.command == "demo" and not 0 <= args.seed <= MAX_SEED:
        demo.error(
            f"argument --seed: must be an int >= 0 and <= {MAX_SEED}, "
            f"got {args.seed}"
        )
    if args.command == "demo":
        import keras

        # The demo trains under `tf.distribute` and exports a SavedModel:
        # on another backend it failed with a traceback after creating
        # its output folders.
        backend = keras.config.backend()
        if backend != "tensorflow":
            demo.error(
                "the demo needs the TensorFlow backend "
                f"(KERAS_BACKEND=tensorflow), got KERAS_BACKEND={backend!r}"
            )
        from keras_attnvariants.demo import requirements_problem

        # Found missing after the training (matplotlib, for the plots),
        # or after the output folders were made (keras-hub).
        problem = requirements_problem()
        if problem:
            demo.error(problem)
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
        cpu_replicas=args.cpu_replicas,
    )
    return 0 if summary["reload_parity"] else 1


if __name__ == "__main__":
    sys.exit(main())
