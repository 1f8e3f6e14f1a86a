# TEST STAND-IN -- not nixpkgs: the few packages and builders that
# flakebot-magic's generated flakes use, as plain `derivation`s whose builder
# is the host's /bin/sh running ./builder.sh.  Needs an unsandboxed Nix.
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
in
{
  inherit lib mkShell bashInteractive cargo rustc;
  clippy = hostTool "clippy" [ "cargo-clippy" "clippy-driver" ];
  rustfmt = hostTool "rustfmt" [ "rustfmt" "cargo-fmt" ];
  rust-analyzer = hostTool "rust-analyzer" [ "rust-analyzer" ];
  rustPlatform = {
    inherit buildRustPackage;
    rust = { inherit cargo rustc; };
  };
}
