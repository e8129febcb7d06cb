//! `attest-engine plugin new <name> --lang rust|python|js`: writes a complete
//! plugin project (a config schema, an example check, its unit tests, a build
//! script and a README) that builds and passes its tests as generated.
//!
//! The templates live in `engine/templates/plugin/` and are compiled into the
//! binary, so a new plugin needs nothing but the engine and the language's
//! toolchain. Python and JavaScript projects carry their own copy of the WIT
//! they are built against; a Rust project depends on the plugin SDK, which
//! carries it.

use std::path::{Path, PathBuf};

/// The guest languages a project can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

impl Lang {
    fn label(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        }
    }
}

/// Why a project was not written.
#[derive(Debug)]
pub enum NewError {
    BadName(String),
    /// A name the language reserves (a keyword, or a module or crate the
    /// project would shadow or depend on).
    Reserved {
        name: String,
        lang: Lang,
        why: &'static str,
    },
    NotEmpty(PathBuf),
    /// `--sdk` given for a language whose projects do not use the Rust SDK.
    SdkForOtherLang(Lang),
    NoSdk(PathBuf),
    Write {
        path: PathBuf,
        why: std::io::Error,
    },
}

impl std::fmt::Display for NewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NewError::BadName(name) => write!(
                f,
                "'{}' cannot name a plugin project: use lowercase letters and digits, joined by single '-', starting with a letter, at most 64 characters (it becomes the plugin id, the crate, module or package name, and the file name)",
                crate::text::clip(name, 80)
            ),
            NewError::Reserved { name, lang, why } => write!(
                f,
                "'{name}' cannot name a {} plugin project: {why}; choose another name, such as '{name}-check'",
                lang.label()
            ),
            NewError::NotEmpty(dir) => write!(
                f,
                "{} exists and is not an empty directory: choose another name, or --dir for an empty or new directory",
                dir.display()
            ),
            NewError::NoSdk(tried) => write!(
                f,
                "the Rust plugin SDK is not at {}: pass --sdk <path of attest-engine's plugin-sdk directory>",
                tried.display()
            ),
            NewError::SdkForOtherLang(lang) => write!(
                f,
                "--sdk names the Rust plugin SDK and applies to --lang rust only; a {} project builds against the WIT it carries, so leave --sdk out",
                lang.label()
            ),
            NewError::Write { path, why } => write!(f, "cannot write {}: {why}", path.display()),
        }
    }
}

impl std::error::Error for NewError {}

/// The contract new Python and JavaScript projects are built against.
const WIT: &str = include_str!("../../wit/since_v0.2.0/attest-plugin.wit");
const TRACE: &str = include_str!("../templates/plugin/common/trace.json");

/// A template file: where it goes, its text, and whether it is a script.
type File = (&'static str, &'static str, bool);

const RUST: &[File] = &[
    ("Cargo.toml", include_str!("../templates/plugin/rust/Cargo.toml"), false),
    ("src/lib.rs", include_str!("../templates/plugin/rust/src/lib.rs"), false),
    (
        "config.schema.json",
        include_str!("../templates/plugin/rust/config.schema.json"),
        false,
    ),
    ("build.sh", include_str!("../templates/plugin/rust/build.sh"), true),
    ("README.md", include_str!("../templates/plugin/rust/README.md"), false),
    (".gitignore", "/target/\n*.wasm\n", false),
];

const PYTHON: &[File] = &[
    ("{{module}}/__init__.py", "", false),
    (
        "{{module}}/logic.py",
        include_str!("../templates/plugin/python/module/logic.py"),
        false,
    ),
    ("{{module}}/app.py", include_str!("../templates/plugin/python/module/app.py"), false),
    (
        "tests/test_logic.py",
        include_str!("../templates/plugin/python/tests/test_logic.py"),
        false,
    ),
    (
        "requirements.txt",
        include_str!("../templates/plugin/python/requirements.txt"),
        false,
    ),
    ("build.sh", include_str!("../templates/plugin/python/build.sh"), true),
    ("README.md", include_str!("../templates/plugin/python/README.md"), false),
    ("wit/attest-plugin.wit", WIT, false),
    (".gitignore", "/.venv/\n__pycache__/\n*.wasm\n", false),
];

const JS: &[File] = &[
    ("src/plugin.js", include_str!("../templates/plugin/js/src/plugin.js"), false),
    (
        "test/plugin.test.js",
        include_str!("../templates/plugin/js/test/plugin.test.js"),
        false,
    ),
    ("package.json", include_str!("../templates/plugin/js/package.json"), false),
    // The engine's imports under `npm test`, which runs outside any engine.
    ("host/fake.js", include_str!("../templates/plugin/js/host/fake.js"), false),
    ("host/resolve.js", include_str!("../templates/plugin/js/host/resolve.js"), false),
    ("host/register.js", include_str!("../templates/plugin/js/host/register.js"), false),
    ("build.sh", include_str!("../templates/plugin/js/build.sh"), true),
    ("README.md", include_str!("../templates/plugin/js/README.md"), false),
    ("wit/attest-plugin.wit", WIT, false),
    (".gitignore", "/node_modules/\n*.wasm\n", false),
];

/// Python keywords: `from <module> import logic` would not parse.
const PYTHON_KEYWORDS: &[&str] = &[
    "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del", "elif", "else", "except", "finally", "for",
    "from", "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with",
    "yield",
];

/// Modules a Python project's package would shadow: the standard library's
/// (`sys.stdlib_module_names` of Python 3.11, which runs the tests, and the
/// names Python 3.14 added, since componentize-py embeds 3.14; those a project
/// name can spell), those componentize-py generates, and pytest and the
/// packages it imports (the build runs it from the project's directory).
const PYTHON_MODULES: &[&str] = &[
    "abc",
    "aifc",
    "annotationlib",
    "antigravity",
    "argparse",
    "array",
    "ast",
    "asynchat",
    "asyncio",
    "asyncore",
    "atexit",
    "audioop",
    "base64",
    "bdb",
    "binascii",
    "bisect",
    "builtins",
    "bz2",
    "calendar",
    "cgi",
    "cgitb",
    "chunk",
    "cmath",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "collections",
    "colorsys",
    "compileall",
    "compression",
    "concurrent",
    "configparser",
    "contextlib",
    "contextvars",
    "copy",
    "copyreg",
    "crypt",
    "csv",
    "ctypes",
    "curses",
    "dataclasses",
    "datetime",
    "dbm",
    "decimal",
    "difflib",
    "dis",
    "distutils",
    "doctest",
    "email",
    "encodings",
    "ensurepip",
    "enum",
    "errno",
    "faulthandler",
    "fcntl",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "gc",
    "genericpath",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "grp",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http",
    "idlelib",
    "imaplib",
    "imghdr",
    "imp",
    "importlib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "lib2to3",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "mailcap",
    "marshal",
    "math",
    "mimetypes",
    "mmap",
    "modulefinder",
    "msilib",
    "msvcrt",
    "multiprocessing",
    "netrc",
    "nis",
    "nntplib",
    "nt",
    "ntpath",
    "nturl2path",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "ossaudiodev",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pipes",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "posix",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "pty",
    "pwd",
    "py_compile",
    "pyclbr",
    "pydoc",
    "pydoc_data",
    "pyexpat",
    "queue",
    "quopri",
    "random",
    "re",
    "readline",
    "reprlib",
    "resource",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "select",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "smtpd",
    "smtplib",
    "sndhdr",
    "socket",
    "socketserver",
    "spwd",
    "sqlite3",
    "sre_compile",
    "sre_constants",
    "sre_parse",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "sunau",
    "symtable",
    "sys",
    "sysconfig",
    "syslog",
    "tabnanny",
    "tarfile",
    "telnetlib",
    "tempfile",
    "termios",
    "textwrap",
    "this",
    "threading",
    "time",
    "timeit",
    "tkinter",
    "token",
    "tokenize",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "tty",
    "turtle",
    "turtledemo",
    "types",
    "typing",
    "unicodedata",
    "unittest",
    "urllib",
    "uu",
    "uuid",
    "venv",
    "warnings",
    "wave",
    "weakref",
    "webbrowser",
    "winreg",
    "winsound",
    "wsgiref",
    "xdrlib",
    "xml",
    "xmlrpc",
    "zipapp",
    "zipfile",
    "zipimport",
    "zlib",
    "zoneinfo",
    "componentize_py_async_support",
    "componentize_py_runtime",
    "componentize_py_types",
    "poll_loop",
    "tests",
    "wit_world",
    // pytest and the packages it imports.
    "iniconfig",
    "packaging",
    "pluggy",
    "py",
    "pygments",
    "pytest",
];

/// Crates a Rust project may not be named after: the standard ones, and its
/// own dependencies.
const RUST_CRATES: &[&str] = &[
    "alloc",
    "attest_plugin_sdk",
    // A path dependency of the SDK: cargo cannot tell two local packages of
    // one name and version apart.
    "attest_trace",
    "core",
    "proc_macro",
    "serde",
    "serde_json",
    "std",
    "test",
    "wit_bindgen",
];

/// Rust's keywords, strict and reserved: cargo refuses them as package names.
const RUST_KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate", "do", "dyn", "else", "enum", "extern",
    "false", "final", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv",
    "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true", "try", "type", "typeof", "unsafe", "unsized", "use",
    "virtual", "where", "while", "yield",
];

/// Why `module` (the project name in snake case) cannot name a `lang` project.
fn reserved(module: &str, lang: Lang) -> Option<&'static str> {
    match lang {
        Lang::Python if PYTHON_KEYWORDS.contains(&module) => Some("it is a Python keyword, so its package could not be imported"),
        Lang::Python if PYTHON_MODULES.contains(&module) => {
            Some("its package would shadow the Python module of that name, which the project or its build imports")
        }
        Lang::Rust if RUST_KEYWORDS.contains(&module) => Some("it is a Rust keyword, which cargo refuses as a package name"),
        Lang::Rust if RUST_CRATES.contains(&module) => Some("its crate would clash with the Rust crate of that name"),
        _ => None,
    }
}

/// The SDK in the checkout this binary was built from (the path is compiled
/// in, so a binary built elsewhere needs `--sdk`).
fn default_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk")
}

/// Whether `name` can name a project in every language.
pub fn is_project_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= 64
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.ends_with('-')
        // `a--b` would be the crate `a__b`, which rustc warns is not snake case.
        && !name.contains("--")
}

/// Writes a `lang` project for plugin `name` into `dir`; returns the files
/// written. `sdk`: the Rust plugin SDK (default: the one in the checkout
/// this binary was built from).
pub fn create(name: &str, lang: Lang, dir: &Path, sdk: Option<&Path>) -> Result<Vec<PathBuf>, NewError> {
    if !is_project_name(name) {
        return Err(NewError::BadName(name.to_owned()));
    }
    if sdk.is_some() && lang != Lang::Rust {
        return Err(NewError::SdkForOtherLang(lang));
    }
    // Anything there but a directory (a file, or a link to nothing, say)
    // is as taken as a directory with files in it.
    let taken = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()),
        Ok(_) => true,
        Err(_) => std::fs::symlink_metadata(dir).is_ok(),
    };
    if taken {
        return Err(NewError::NotEmpty(dir.to_owned()));
    }
    let snake = name.replace('-', "_");
    if let Some(why) = reserved(&snake, lang) {
        return Err(NewError::Reserved {
            name: name.to_owned(),
            lang,
            why,
        });
    }
    let mut vars: Vec<(&str, String)> = vec![("{{name}}", name.to_owned()), ("{{crate}}", snake.clone()), ("{{module}}", snake)];
    let files = match lang {
        Lang::Rust => {
            let sdk = sdk.map(Path::to_path_buf).unwrap_or_else(default_sdk);
            let sdk = sdk
                .canonicalize()
                .ok()
                .filter(|p| p.join("Cargo.toml").is_file())
                .ok_or(NewError::NoSdk(sdk))?;
            // A TOML string, quoted and escaped, whatever the path holds.
            vars.push(("{{sdk}}", toml::Value::String(sdk.display().to_string()).to_string()));
            RUST
        }
        Lang::Python => PYTHON,
        Lang::Js => JS,
    };
    let fill = |text: &str| vars.iter().fold(text.to_owned(), |t, (k, v)| t.replace(k, v));
    let created = !dir.exists();
    let mut written = Vec::new();
    let all = files.iter().copied().chain(std::iter::once(("trace.json", TRACE, false)));
    for (path, text, script) in all {
        let path = dir.join(fill(path));
        if let Err(why) = write(&path, &fill(text), script) {
            // Half a project would only be in the way of the next try.
            if created {
                let _ = std::fs::remove_dir_all(dir);
            } else {
                for f in written.iter().chain([&path]) {
                    let _ = std::fs::remove_file(f);
                }
            }
            return Err(NewError::Write { path, why });
        }
        written.push(path);
    }
    Ok(written)
}

/// `path` as a shell word: quoted when it holds anything a shell would
/// split or expand.
fn shell_word(path: &Path) -> String {
    let s = path.display().to_string();
    let plain = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@%".contains(&b));
    if plain {
        s
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn write(path: &Path, text: &str, script: bool) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    if script {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// What to do next, for the person who ran `plugin new`.
pub fn next_steps(name: &str, lang: Lang, dir: &Path, sdk: Option<&Path>) -> String {
    let test = match lang {
        Lang::Rust => "cargo test && ./build.sh",
        Lang::Python | Lang::Js => "./build.sh            # runs the tests, then builds",
    };
    let sdk = match lang {
        Lang::Rust => format!(
            "using the plugin SDK at {}\n",
            sdk.map(Path::to_path_buf)
                .unwrap_or_else(default_sdk)
                .canonicalize()
                .unwrap_or_default()
                .display()
        ),
        Lang::Python | Lang::Js => String::new(),
    };
    format!(
        "created {dir}\n{sdk}\nnext:\n  cd {cd}\n  {test}\n  attest-engine plugin test {name}.wasm --trace trace.json --plugin-config-json '{{\"phrase\": \"refund\"}}'\n  attest-engine --plugin {name}.wasm     # serve it to an SDK\n",
        dir = dir.display(),
        cd = shell_word(dir)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_suit_every_language() {
        for ok in ["tone", "brand-tone", "check2"] {
            assert!(is_project_name(ok), "{ok}");
        }
        for bad in ["", "Tone", "2fast", "-x", "x-", "a--b", "a_b", "a.b", "ü", &"x".repeat(65)] {
            assert!(!is_project_name(bad), "{bad}");
        }
    }

    #[test]
    fn every_language_gets_a_complete_project_with_its_name_filled_in() {
        for (lang, expect) in [
            (
                Lang::Rust,
                &[
                    "Cargo.toml",
                    "src/lib.rs",
                    "config.schema.json",
                    "build.sh",
                    "README.md",
                    "trace.json",
                ][..],
            ),
            (
                Lang::Python,
                &[
                    "brand_tone/logic.py",
                    "brand_tone/app.py",
                    "tests/test_logic.py",
                    "build.sh",
                    "wit/attest-plugin.wit",
                ][..],
            ),
            (
                Lang::Js,
                &[
                    "src/plugin.js",
                    "test/plugin.test.js",
                    "package.json",
                    "host/fake.js",
                    "build.sh",
                    "wit/attest-plugin.wit",
                ][..],
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("brand-tone");
            let files = create("brand-tone", lang, &root, None).unwrap();
            for e in expect {
                assert!(files.contains(&root.join(e)), "{lang:?}: {e} missing from {files:?}");
            }
            for f in &files {
                let text = std::fs::read_to_string(f).unwrap();
                assert!(!text.contains("{{"), "{}: an unfilled placeholder", f.display());
            }
            let script = std::fs::metadata(root.join("build.sh")).unwrap();
            assert!(std::os::unix::fs::PermissionsExt::mode(&script.permissions()) & 0o111 != 0);
            assert!(matches!(create("brand-tone", lang, &root, None), Err(NewError::NotEmpty(_))));
            let file = root.join("build.sh");
            assert!(
                matches!(create("brand-tone", lang, &file, None), Err(NewError::NotEmpty(_))),
                "a file is no project directory"
            );
        }
    }

    #[test]
    fn bad_names_and_a_missing_sdk_are_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = create("Bad Name", Lang::Js, dir.path(), None).unwrap_err();
        assert!(e.to_string().contains("lowercase letters and digits, joined by single '-'"), "{e}");
        let e = create("ok", Lang::Rust, &dir.path().join("ok"), Some(Path::new("/nowhere"))).unwrap_err();
        assert!(e.to_string().contains("pass --sdk"), "{e}");
        for lang in [Lang::Python, Lang::Js] {
            let target = dir.path().join(format!("{lang:?}"));
            let e = create("ok", lang, &target, Some(Path::new("plugin-sdk"))).unwrap_err();
            assert!(e.to_string().contains("applies to --lang rust only"), "{e}");
            assert!(!target.exists(), "nothing written");
        }
    }

    #[test]
    fn an_sdk_path_with_quotes_or_backslashes_stays_one_toml_string() {
        let dir = tempfile::tempdir().unwrap();
        let sdk = dir.path().join("sdk \"q\" \\ x");
        std::fs::create_dir_all(&sdk).unwrap();
        std::fs::write(sdk.join("Cargo.toml"), "").unwrap();
        let root = dir.path().join("p");
        create("p", Lang::Rust, &root, Some(&sdk)).unwrap();
        let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml")).unwrap().parse().unwrap();
        let path = manifest["dependencies"]["attest-plugin-sdk"]["path"].as_str().unwrap();
        assert_eq!(Path::new(path), sdk.canonicalize().unwrap());
    }

    #[test]
    fn a_failed_write_leaves_nothing_behind_and_a_dangling_link_is_taken() {
        let tmp = tempfile::tempdir().unwrap();
        // A directory whose path is so long that `src/plugin.js` fits under
        // PATH_MAX (4,096 bytes with the NUL) and `test/plugin.test.js`,
        // written next, does not.
        let mut dir = tmp.path().to_path_buf();
        while dir.as_os_str().len() < 4078 - 201 {
            dir.push("d".repeat(200));
        }
        let last = 4078 - dir.as_os_str().len() - 1;
        dir.push("e".repeat(last));
        assert_eq!(dir.as_os_str().len(), 4078);
        let e = create("p", Lang::Js, &dir, None).unwrap_err();
        assert!(
            matches!(&e, NewError::Write { path, .. } if path.ends_with("test/plugin.test.js")),
            "{e}"
        );
        assert!(!dir.exists(), "the half-written project is removed");

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink("/nonexistent/target", &link).unwrap();
        let e = create("p", Lang::Js, &link, None).unwrap_err();
        assert!(matches!(e, NewError::NotEmpty(_)), "{e}");
    }

    #[test]
    fn next_steps_quote_a_directory_the_shell_would_split() {
        let steps = next_steps("p", Lang::Js, Path::new("with space/it's"), None);
        assert!(steps.contains("  cd 'with space/it'\\''s'\n"), "{steps}");
        let steps = next_steps("p", Lang::Js, Path::new("plain/dir-1"), None);
        assert!(steps.contains("  cd plain/dir-1\n"), "{steps}");
    }

    #[test]
    fn names_a_language_reserves_are_refused_for_that_language_only() {
        let dir = tempfile::tempdir().unwrap();
        for (name, lang, why) in [
            ("json", Lang::Python, "would shadow the Python module"),
            ("types", Lang::Python, "would shadow the Python module"),
            ("wit-world", Lang::Python, "would shadow the Python module"),
            ("for", Lang::Python, "Python keyword"),
            ("class", Lang::Python, "Python keyword"),
            ("std", Lang::Rust, "clash with the Rust crate"),
            ("serde-json", Lang::Rust, "clash with the Rust crate"),
            ("type", Lang::Rust, "Rust keyword"),
            ("attest-trace", Lang::Rust, "clash with the Rust crate"),
            ("pluggy", Lang::Python, "would shadow the Python module"),
            ("annotationlib", Lang::Python, "would shadow the Python module"),
            ("match", Lang::Rust, "Rust keyword"),
        ] {
            let e = create(name, lang, &dir.path().join(name), None).unwrap_err();
            assert!(
                e.to_string().contains(why) && e.to_string().contains(&format!("'{name}-check'")),
                "{name}: {e}"
            );
            assert!(!dir.path().join(name).exists(), "{name}: nothing written");
        }
        // The same names are fine where nothing clashes.
        create("json", Lang::Js, &dir.path().join("json"), None).unwrap();
        create("for", Lang::Js, &dir.path().join("for"), None).unwrap();
    }
}
