# lit configuration for the ulplint test suite.
import os
import shlex
import shutil
import sys

import lit.formats

config.name = "ulplint"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".c", ".cpp", ".test"]
config.excludes = ["Inputs", "example", "bench", "check_ulplint.py", "expect_exit.py", "validate_json.py", "lsp", "accuracy", "fuzz"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.ulplint_obj_root, "testsuite")

src = config.ulplint_src_root
obj = config.ulplint_obj_root
ulplint = os.path.join(obj, "tool", "ulplint")
plugin = os.path.join(obj, "tool", "libulplint-tidy.so")
python = shlex.quote(sys.executable)
check = os.path.join(src, "testsuite", "check_ulplint.py")
kernel_include = os.path.join(src, "testsuite", "Inputs", "kernel", "include")

config.environment["PATH"] = os.pathsep.join(
    [config.llvm_tools_dir, os.path.join(obj, "tool"), config.environment.get("PATH", "")])
for var in ("HOME", "TMPDIR"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

common = "--ulplint %s --plugin %s --clang %s --clang-tidy %s --kernel-include %s" % (
    ulplint, plugin, config.clang, config.clang_tidy, kernel_include)
config.substitutions.append(("%check_ulplint", "%s %s %s" % (python, check, common)))
config.substitutions.append(("%ulplint", ulplint))
config.substitutions.append(("%plugin", plugin))
config.substitutions.append(("%clang_tidy", config.clang_tidy))
config.substitutions.append(("%clang", config.clang))
config.substitutions.append(("%kernel_include", kernel_include))
config.substitutions.append(("%expect_exit", "%s %s" % (python, os.path.join(src, "testsuite", "expect_exit.py"))))
config.substitutions.append(("%validate_json", "%s %s" % (python, os.path.join(src, "testsuite", "validate_json.py"))))
config.substitutions.append(("%sarif_schema", os.path.join(src, "testsuite", "Inputs", "sarif-schema-2.1.0.json")))
config.substitutions.append(("%example_db", os.path.join(obj, "example")))
config.substitutions.append(("%example", os.path.join(src, "testsuite", "example")))
config.substitutions.append(("%blkdemo", os.path.join(obj, "example", "bin")))
config.substitutions.append(("%python", python))
config.substitutions.append(("%srcroot", src))
config.substitutions.append(("%bindir", obj))

# util-linux's script(1) runs a command on a pseudo-terminal.
if shutil.which("script"):
    config.available_features.add("script")

if config.regcore_built:
    config.available_features.add("regcore")

# ulplint-clangd, driven over LSP by testsuite/lsp/lsp_client.py.
if getattr(config, "clangd_built", False):
    config.available_features.add("clangd")
    config.substitutions.append(("%lsp_server", os.path.join(obj, "tool", "ulplint-clangd")))
    config.substitutions.append(("%lsp_client", "%s %s" % (python, os.path.join(src, "testsuite", "lsp", "lsp_client.py"))))

# The report's HTML is checked in a real browser. scripts/bootstrap.sh
# installs Debian's chromium; without it those tests are unsupported.
import shutil as _shutil
_chromium = _shutil.which("chromium") or _shutil.which("chromium-browser")
if _chromium:
    config.available_features.add("chromium")
    config.substitutions.append(("%chromium", _chromium))
