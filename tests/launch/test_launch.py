"""launch/local.sh and launch/slurm.sbatch where the user stands, and the installed tree.

    python3 tests/launch/test_launch.py LFM2_RANK H5PACK RANK_TEST_FILES BUILD_DIR

- every form of local.sh's own flags (-n 2, -n=2, -n2, -np 2, --ranks 2, --ranks=2, --hostfile F,
  --hostfile=F) gives mpirun the same, and lfm2-rank's options pass through untouched; bad values
  are one error line; a fake mpirun records what it was given and where;
- a real 2-rank run from a scratch directory with relative --model / --inputs / --output writes its
  output there (the caller's directory, not the checkout);
- the shipped default's model is generated into the cache directory (XDG_CACHE_HOME), once, and
  never into the sources;
- slurm.sbatch keeps SLURM_SUBMIT_DIR and adds --threads from --cpus-per-task only when the user
  gave it in neither form;
- `cmake --install` into a scratch prefix: P/bin/h5pack --version, P/bin/lfm2-text --help, and
  P/bin/lfm2-local running the default from another directory with the installed binary and data.
Standard library only (the tools' optional modules are not needed)."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LOCAL = os.path.join(ROOT, "launch", "local.sh")
SLURM = os.path.join(ROOT, "launch", "slurm.sbatch")
RANK, H5PACK, FILES, BUILD = (sys.argv.pop(1) for _ in range(4)) if len(sys.argv) > 4 else (None,) * 4

FAKE_MPIRUN = """#!/bin/sh
# records where it ran and what it was given, one argument a line
{ echo "CWD=$PWD"; for a in "$@"; do echo "ARG=$a"; done; } > "$FAKE_LOG"
"""


class Launch(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.bin = self.path("fakebin")
        os.mkdir(self.bin)
        mpirun = os.path.join(self.bin, "mpirun")
        with open(mpirun, "w") as f:
            f.write(FAKE_MPIRUN)
        os.chmod(mpirun, os.stat(mpirun).st_mode | stat.S_IEXEC)
        self.log = self.path("mpirun.log")
        self.work = self.path("work")
        os.mkdir(self.work)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def env(self, fake=True, **extra):
        env = dict(os.environ, LFM2_RANK=RANK, FAKE_LOG=self.log, XDG_CACHE_HOME=self.path("cache"))
        env.pop("LFM2_CACHE_DIR", None)
        if fake:
            env["PATH"] = self.bin + os.pathsep + env["PATH"]
        env.update(extra)
        return env

    def run_script(self, script, *args, fake=True, cwd=None, **extra):
        return subprocess.run(["bash", script, *args], capture_output=True, text=True, cwd=cwd or self.work,
                              env=self.env(fake, **extra), timeout=300)

    def recorded(self):
        with open(self.log) as f:
            lines = f.read().splitlines()
        return lines[0][4:], [l[4:] for l in lines[1:]]

    def test_flag_forms_and_where_it_runs(self):
        with open(os.path.join(self.work, "hosts.txt"), "w") as f:
            f.write("localhost slots=2\n")
        passthrough = ["--inputs", "in.h5", "--output=out.h5", "--max-new-tokens=4", "--threads", "2"]
        for form in (["-n", "2"], ["-n=2"], ["-n2"], ["-np", "2"], ["--ranks", "2"], ["--ranks=2"]):
            for host in ([], ["--hostfile", "hosts.txt"], ["--hostfile=hosts.txt"]):
                p = self.run_script(LOCAL, *form, *host, *passthrough)
                self.assertEqual(p.returncode, 0, (form, host, p.stderr))
                cwd, args = self.recorded()
                self.assertEqual(cwd, os.path.realpath(self.work), form)
                self.assertEqual(args[:2], ["-np", "2"], (form, args))
                self.assertEqual(args.count("-np"), 1, args)
                self.assertEqual(args[args.index(RANK) + 1:], passthrough, (form, args))
                if host:
                    self.assertEqual(args[args.index("--hostfile") + 1], "hosts.txt", (form, host))
                    self.assertNotIn("--oversubscribe", args)

    def test_bad_own_flags(self):
        for args, msg in ((["-n", "0", "--inputs", "in.h5"], "-n: '0' is not a number of ranks"),
                          (["--ranks=x", "--inputs", "in.h5"], "--ranks: 'x' is not"),
                          (["-np", "--inputs", "in.h5"], "-np: '--inputs' is not"),
                          (["--inputs", "in.h5", "--ranks"], "--ranks needs a number of ranks"),
                          (["--hostfile=nope.txt"], "--hostfile nope.txt: no such file")):
            p = self.run_script(LOCAL, *args)
            self.assertEqual(p.returncode, 1, args)
            lines = p.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, p.stderr)
            self.assertTrue(lines[0].startswith(f"launch/local.sh: error: {msg}"), p.stderr)
            self.assertFalse(os.path.exists(self.log))

    def test_a_real_run_writes_where_the_user_stands(self):
        subprocess.run([H5PACK, "-q", "synth", os.path.join(self.work, "m.h5"), "--preset", "lfm2-tiny", "--dtype",
                        "fp32"], check=True, capture_output=True)
        subprocess.run([FILES, "make", self.work, os.path.join(self.work, "m.h5")], check=True, capture_output=True)
        os.mkdir(os.path.join(self.work, "out"))
        p = self.run_script(LOCAL, "-n", "2", "--model", "m.h5", "--inputs=inputs.h5", "--output", "out/o.h5",
                            "--timeout", "60", fake=False, cwd=self.work)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertTrue(os.path.isfile(os.path.join(self.work, "out", "o.h5")))
        self.assertFalse(os.path.exists(os.path.join(ROOT, "out", "o.h5")))

    def test_the_default_model_goes_to_the_cache(self):
        src_model = os.path.join(ROOT, "data", "default", "model.h5")
        before = os.stat(src_model).st_mtime if os.path.exists(src_model) else None
        p = self.run_script(LOCAL, "-n", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("creating the default model (once)", p.stderr)
        cached = self.path("cache", "lfm2-rank", "default", "lfm2-mini-seed1234-fp32.h5")
        self.assertTrue(os.path.isfile(cached))
        _, args = self.recorded()
        tail = args[args.index(RANK) + 1:]
        data = os.path.join(ROOT, "data", "default")
        self.assertEqual(tail, ["--model", cached, "--inputs", os.path.join(data, "inputs.h5"), "--answers",
                                os.path.join(data, "answers.h5")])
        p = self.run_script(LOCAL, "-n", "2")
        self.assertNotIn("creating", p.stderr)  # once
        after = os.stat(src_model).st_mtime if os.path.exists(src_model) else None
        self.assertEqual(before, after, "the sources' data/default/model.h5 was written")

    def test_slurm_keeps_the_submit_dir_and_every_threads_form(self):
        submit = self.path("submit")
        os.mkdir(submit)
        env = dict(SLURM_SUBMIT_DIR=submit, SLURM_NTASKS="2", SLURM_CPUS_PER_TASK="3", LFM2_LAUNCHER="mpirun")
        for given, want in ((["--threads=8"], ["--threads=8"]), (["--threads", "8"], ["--threads", "8"]),
                            ([], ["--threads", "3"])):
            p = self.run_script(SLURM, "--inputs", "in.h5", *given, cwd=self.dir, **env)
            self.assertEqual(p.returncode, 0, p.stderr)
            cwd, args = self.recorded()
            self.assertEqual(cwd, os.path.realpath(submit))
            tail = args[args.index(RANK) + 1:]
            self.assertEqual(tail, ["--inputs", "in.h5"] + want, given)
            self.assertEqual(sum(a.startswith("--threads") for a in tail), 1, tail)

    def test_the_installed_tree(self):
        prefix = self.path("prefix")
        p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        v = subprocess.run([os.path.join(prefix, "bin", "h5pack"), "--version"], capture_output=True, text=True)
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertRegex(v.stdout, r"^h5pack \d+\.\d+\.\d+ \(lfm2-rank .*, commit \w+.*\)\nbuilt with: CUDA .*, NCCL .*, "
                                   r".*MPI.*, HDF5 .*")
        t = subprocess.run([sys.executable, os.path.join(prefix, "bin", "lfm2-text"), "--help"], capture_output=True,
                           text=True)
        self.assertEqual(t.returncode, 0, t.stderr)
        env = self.env(LFM2_RANK="")
        env.pop("LFM2_RANK")
        p = subprocess.run([os.path.join(prefix, "bin", "lfm2-local"), "-n", "2"], capture_output=True, text=True,
                           cwd=self.work, env=env, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        _, args = self.recorded()
        share = os.path.join(prefix, "share", "lfm2-rank", "data", "default")
        self.assertEqual(os.path.realpath(args[args.index("--model") - 1]),
                         os.path.realpath(os.path.join(prefix, "bin", "lfm2-rank")))
        self.assertEqual(os.path.realpath(args[args.index("--inputs") + 1]),
                         os.path.realpath(os.path.join(share, "inputs.h5")))
        self.assertEqual(sorted(os.listdir(share)), ["answers.h5", "inputs.h5", "recipe.json"])  # no model there


if __name__ == "__main__":
    if RANK is None:
        sys.exit(__doc__)
    unittest.main(verbosity=1)
