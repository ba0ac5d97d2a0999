"""What every tools/ script shares: one-line errors and exit 1 instead of a traceback, optional
modules imported only when needed (so `--help` works without them) with the pip package to install,
and the file rules of lfm2-rank (docs/pipeline.md, "Files that are not regular files"): inputs must
be regular files (a FIFO would block), outputs are written under a temporary name and renamed into
place, never over an input, a device, a FIFO or a socket; a symbolic link to a regular file is
followed and kept. Standard library only."""
import contextlib
import importlib
import os
import stat
import sys

REQUIREMENTS = "pip install -r tools/requirements.txt"
PIP_NAMES = {"h5py": "h5py", "numpy": "numpy", "torch": "torch", "transformers": "transformers",
             "safetensors": "safetensors", "tokenizers": "tokenizers", "matplotlib": "matplotlib",
             "jinja2": "jinja2"}


class ToolError(Exception):
    """An error the user can act on: printed as one line, exit 1."""


def need(tool, module):
    """Imports `module` (e.g. "h5py", "safetensors.torch") or ends the run with one line saying what
    to install."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # ImportError, or a broken installation
        top = module.split(".")[0]
        # the interpreter too: under `mpirun` by its absolute path, Open MPI puts that bin directory
        # first on PATH, and `python3` may then be another one than the user's
        sys.exit(f"{tool}: error: needs the Python module '{top}' in {sys.executable} ({type(e).__name__}: {e}); "
                 f"install it with `pip install {PIP_NAMES.get(top, top)}` or `{REQUIREMENTS}`, or set "
                 f"LFM2_PYTHON to a Python that has it")


def run(tool, main, *args):
    """Calls main(*args); any error becomes "<tool>: error: ..." on stderr and exit 1."""
    try:
        return main(*args)
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        return 130
    except ToolError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"{tool}: error: {where}{e.strerror or e}", file=sys.stderr)
    except Exception as e:  # a malformed file reaches a library's own exception types
        print(f"{tool}: error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def check_input(path, what="input"):
    """Raises ToolError unless `path` is a regular file (through symbolic links)."""
    if not path:
        raise ToolError(f"{what}: an empty path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise ToolError(f"{what} {path}: is a symbolic link to a missing file") from None
        raise ToolError(f"{what} {path}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{what} {path}: is a {_kind(st.st_mode)}, not a regular file")
    return path


def open_h5(tool, path, what):
    """The HDF5 file at `path` (a regular file: check_input), open for reading; a ToolError naming
    it when it is not one. Imports h5py (need)."""
    check_input(path, what)
    h5py = need(tool, "h5py")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise ToolError(f"{what} {path}: not an HDF5 file ({e})") from None


def output_target(path, what="output", inputs=()):
    """The file an output at `path` replaces (a link's target), after the checks above; refuses an
    output that is one of `inputs` (same device and inode)."""
    if not path:
        raise ToolError(f"{what}: an empty path")
    target = path
    if os.path.islink(path):
        if not os.path.exists(path):
            raise ToolError(f"{what} {path}: is a symbolic link to a missing file")
        target = os.path.realpath(path)
    if os.path.lexists(target):
        st = os.stat(target)
        if not stat.S_ISREG(st.st_mode):
            link = " a symbolic link to" if target != path else ""
            raise ToolError(f"{what} {path}: is{link} a {_kind(st.st_mode)}, not a regular file")
        for i in inputs:
            if i and os.path.exists(i) and os.path.samefile(i, target):
                raise ToolError(f"{what} {path}: is also the input {i}; refusing to overwrite an input")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise ToolError(f"{what} {path}: cannot write into {parent}: no such directory")
    return target


@contextlib.contextmanager
def atomic_output(path, what="output", inputs=()):
    """Yields a temporary path beside the output's target; renames it into place when the block
    ends normally, removes it otherwise."""
    target = output_target(path, what, inputs)
    tmp = f"{target}.tmp.{os.uname().nodename.split('.')[0]}.{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
