# TEST STAND-IN -- not nixpkgs: the few packages and builders that
# flakebot-magic's generated flakes (and its own ../../flake.nix) use, as
# plain `derivation`s whose builder is the host's /bin/sh running
# ./builder.sh or ./python.sh, in Nix's sandbox with the host paths that
# scripts/setup-nix.sh binds (`extra-sandbox-paths`).
{ lib, system }:
let
  hostPath = "/usr/bin:/bin";

  run = name: mode: env: derivation ({
    inherit name system;
    builder = "/bin/sh";
    args = [ "-eu" ./builder.sh mode ];
    PATH = hostPath;
  } // env);

  # A package whose bin/ holds wrappers around host tools (found at build time).
  hostTool = pname: tools: run "${pname}-host" "host-tool" { tools = toString tools; } // {
    inherit pname;
    version = "host";
    meta = { mainProgram = builtins.head tools; description = "${pname} of the host's Rust toolchain (test stand-in)"; };
  };

  # cargo calls "$RUSTC_WRAPPER rustc ARGS..."; the wrapper maps the build
  # directory and the registry to fixed names, without putting varying paths
  # into RUSTFLAGS (which cargo may hash into symbol names).
  rustcWrapper = run "rustc-remap-wrapper" "rustc-wrapper" { };

  buildRustPackage =
    { pname
    , version
    , src
    , cargoLock ? null
    , doCheck ? true
    , meta ? { }
    , passthru ? { }
    , cargoBuildFlags ? [ ]
    , cargoTestFlags ? [ ]
    , buildFeatures ? [ ]
    , buildNoDefaultFeatures ? false
    , nativeBuildInputs ? [ ]
    , buildInputs ? [ ]
    , RUSTFLAGS ? ""
    , RUSTDOCFLAGS ? ""
    , preBuild ? ""
    , installPhase ? ""
    , ...
    }@args:
    let
      lockFile =
        if cargoLock != null && cargoLock ? lockFile then cargoLock.lockFile
        else throw "buildRustPackage (test stand-in): only cargoLock.lockFile is supported, not cargoHash (no network to vendor with)";
      drv = run "${pname}-${version}" "build-rust-package" {
        inherit pname version src rustcWrapper;
        cargoLockFile = lockFile;
        doCheck = if doCheck then "1" else "";
        cargoBuildFlags = toString (cargoBuildFlags
          ++ (if buildNoDefaultFeatures then [ "--no-default-features" ] else [ ])
          ++ (if buildFeatures != [ ] then [ "--features=${builtins.concatStringsSep "," buildFeatures}" ] else [ ]));
        cargoTestFlags = toString cargoTestFlags;
        # as nixpkgs' mkDerivation: attributes it does not know become the builder's environment
        inherit RUSTFLAGS RUSTDOCFLAGS;
        # as nixpkgs' buildRustPackage: a shell snippet run before cargo builds, and one that replaces the
        # install (cargoInstallHook) when given
        inherit preBuild installPhase;
        PATH = lib.makeBinPath (nativeBuildInputs ++ buildInputs) + ":" + hostPath;
        SOURCE_DATE_EPOCH = "315532800"; # 1980-01-01, as nixpkgs
      };
    in
    drv // passthru // {
      inherit pname version meta passthru;
      overrideAttrs = f: buildRustPackage (args // (f args));
    };

  mkShell =
    { name ? "nix-shell"
    , packages ? [ ]
    , buildInputs ? [ ]
    , nativeBuildInputs ? [ ]
    , inputsFrom ? [ ]
    , shellHook ? ""
    , ...
    }:
    # bash, not sh: `nix develop` runs the builder with its get-env.sh.
    run name "mk-shell" {
      builder = "/bin/bash";
      outputs = [ "out" ]; # get-env.sh dumps into each of $outputs
      args = [ "-eu" ./builder.sh "mk-shell" ];
      PATH = lib.makeBinPath (packages ++ nativeBuildInputs ++ buildInputs) + ":" + hostPath;
      inherit shellHook;
    };

  # `nix develop` looks for the shell to run here
  bashInteractive = run "bash-host" "host-binary" { binaries = "/bin/bash"; } // {
    pname = "bash";
    version = "host";
    meta.mainProgram = "bash";
  };

  cargo = hostTool "cargo" [ "cargo" ];
  rustc = hostTool "rustc" [ "rustc" "rustdoc" ];

  # -- Python, for flakebot-magic's own flake (../../flake.nix) --------------
  # Built by ./python.sh, so that the Rust derivations above stay unchanged.
  runPy = name: mode: env: run name mode ({ args = [ "-eu" ./python.sh mode ]; } // env);

  # python3Packages.NAME: only a name and the module it imports as; the
  # host's Python must have it (a virtualenv: see python.sh).
  pyModule = pname: module: { inherit pname module; version = "host"; pythonModule = true; };
  python3Packages = builtins.mapAttrs pyModule {
    ipython = "IPython"; ipywidgets = "ipywidgets"; jupyter-server = "jupyter_server";
    httpx = "httpx"; openai = "openai"; platformdirs = "platformdirs"; pygit2 = "pygit2"; tomlkit = "tomlkit";
    traitlets = "traitlets"; hatchling = "hatchling"; pytest = "pytest"; nbval = "nbval";
    ipykernel = "ipykernel"; nbconvert = "nbconvert"; nbformat = "nbformat"; jupyterlab = "jupyterlab";
  } // { inherit buildPythonPackage; };

  # python3.withPackages (ps: [ ... ]): a bin/python3 that runs the host's
  # Python at run time, with stand-in buildPythonPackage outputs on PYTHONPATH.
  pythonEnv = packages:
    let
      built = builtins.filter (p: p ? sitePackages) packages;
      modules = map (p: p.module) (builtins.filter (p: p ? module) packages);
    in
    runPy "python3-host-env" "python-env" {
      modules = toString modules;
      sitePackages = builtins.concatStringsSep ":" (map (p: "${p}/lib/python3/site-packages") built);
    } // { withPackages = f: pythonEnv (packages ++ f python3Packages); pythonVersion = "host"; };
  python3 = pythonEnv [ ];

  buildPythonPackage =
    { pname
    , version
    , src
    , pythonImportsCheck ? [ ]
    , meta ? { }
    , ...
    }:
    runPy "python3-${pname}-${version}" "python-package" {
      inherit pname version src;
      python = python3;
      importsCheck = toString pythonImportsCheck;
    } // { inherit pname version meta; sitePackages = true; };

  writeTextFile = { name, text, destination ? "", executable ? false }:
    runPy name "write-text" { inherit text destination; executable = if executable then "1" else ""; };
  writeTextDir = path: text: writeTextFile { name = baseNameOf path; inherit text; destination = path; };
  writeShellScriptBin = name: text: writeTextFile {
    inherit name;
    text = "#!/bin/bash\n" + text;
    destination = "bin/${name}";
    executable = true;
  } // { meta.mainProgram = name; };

  hostBinaries = pname: binaries: run "${pname}-host" "host-binary" { binaries = toString binaries; } // {
    inherit pname;
    version = "host";
    meta.mainProgram = pname;
  };
in
{
  inherit lib system mkShell bashInteractive cargo rustc;
  inherit python3 python3Packages writeTextFile writeTextDir writeShellScriptBin;
  nix = hostBinaries "nix" (map (b: "/usr/bin/${b}") [ "nix" "nix-build" "nix-collect-garbage" "nix-env" "nix-instantiate" "nix-shell" "nix-store" ]);
  git = hostBinaries "git" [ "/usr/bin/git" ];
  clippy = hostTool "clippy" [ "cargo-clippy" "clippy-driver" ];
  rustfmt = hostTool "rustfmt" [ "rustfmt" "cargo-fmt" ];
  rust-analyzer = hostTool "rust-analyzer" [ "rust-analyzer" ];
  rustPlatform = {
    inherit buildRustPackage;
    rust = { inherit cargo rustc; };
  };
}
