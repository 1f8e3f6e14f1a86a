# TEST STAND-IN -- not nixpkgs' lib: just the few functions (same names, same
# behaviour for the cases used) that flakebot-magic's generated flakes call.
let
  genAttrs = names: f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) names);

  upper = [ "A" "B" "C" "D" "E" "F" "G" "H" "I" "J" "K" "L" "M" "N" "O" "P" "Q" "R" "S" "T" "U" "V" "W" "X" "Y" "Z" ];
  lower = [ "a" "b" "c" "d" "e" "f" "g" "h" "i" "j" "k" "l" "m" "n" "o" "p" "q" "r" "s" "t" "u" "v" "w" "x" "y" "z" ];
  toLower = builtins.replaceStrings upper lower;

  # Same attribute names, spdxIds and fields as nixpkgs' lib.licenses.
  licenses = builtins.mapAttrs
    (name: l: { shortName = name; free = true; redistributable = true; deprecated = false; } // l)
    {
      mit = { spdxId = "MIT"; fullName = "MIT License"; };
      asl20 = { spdxId = "Apache-2.0"; fullName = "Apache License 2.0"; };
      bsd0 = { spdxId = "0BSD"; fullName = "BSD Zero Clause License"; };
      bsd2 = { spdxId = "BSD-2-Clause"; fullName = ''BSD 2-clause "Simplified" License''; };
      bsd3 = { spdxId = "BSD-3-Clause"; fullName = ''BSD 3-clause "New" or "Revised" License''; };
      isc = { spdxId = "ISC"; fullName = "ISC License"; };
      mpl20 = { spdxId = "MPL-2.0"; fullName = "Mozilla Public License 2.0"; };
      unlicense = { spdxId = "Unlicense"; fullName = "The Unlicense"; };
      zlib = { spdxId = "Zlib"; fullName = "zlib License"; };
      boost = { spdxId = "BSL-1.0"; fullName = "Boost Software License 1.0"; };
      cc0 = { spdxId = "CC0-1.0"; fullName = "Creative Commons Zero v1.0 Universal"; };
      wtfpl = { spdxId = "WTFPL"; fullName = "Do What The F*ck You Want To Public License"; };
      unicode-dfs-2016 = { spdxId = "Unicode-DFS-2016"; fullName = "Unicode License Agreement - Data Files and Software (2016)"; };
      gpl2Only = { spdxId = "GPL-2.0-only"; fullName = "GNU General Public License v2.0 only"; };
      gpl2Plus = { spdxId = "GPL-2.0-or-later"; fullName = "GNU General Public License v2.0 or later"; };
      gpl3Only = { spdxId = "GPL-3.0-only"; fullName = "GNU General Public License v3.0 only"; };
      gpl3Plus = { spdxId = "GPL-3.0-or-later"; fullName = "GNU General Public License v3.0 or later"; };
      lgpl21Only = { spdxId = "LGPL-2.1-only"; fullName = "GNU Lesser General Public License v2.1 only"; };
      lgpl21Plus = { spdxId = "LGPL-2.1-or-later"; fullName = "GNU Lesser General Public License v2.1 or later"; };
      lgpl3Only = { spdxId = "LGPL-3.0-only"; fullName = "GNU Lesser General Public License v3.0 only"; };
      lgpl3Plus = { spdxId = "LGPL-3.0-or-later"; fullName = "GNU Lesser General Public License v3.0 or later"; };
      agpl3Only = { spdxId = "AGPL-3.0-only"; fullName = "GNU Affero General Public License v3.0 only"; };
      agpl3Plus = { spdxId = "AGPL-3.0-or-later"; fullName = "GNU Affero General Public License v3.0 or later"; };
      unfree = { fullName = "Unfree"; free = false; redistributable = false; };
    };

  # As nixpkgs' lib.meta.getLicenseFromSpdxId: case-insensitive lookup, and
  # { shortName = id; } (with a warning) for an id it does not know.
  spdxLicenses = builtins.listToAttrs (map
    (l: { name = toLower l.spdxId; value = l; })
    (builtins.filter (l: l ? spdxId) (builtins.attrValues licenses)));
  getLicenseFromSpdxId = id:
    spdxLicenses.${toLower id} or (builtins.trace
      "warning: getLicenseFromSpdxId: No license matches the given SPDX ID: ${id}"
      { shortName = id; });

  hasPrefix = pref: str: builtins.substring 0 (builtins.stringLength pref) str == pref;

  makeBinPath = pkgs: builtins.concatStringsSep ":" (map (p: "${p}/bin") pkgs);

  getExe' = drv: exe: "${drv}/bin/${exe}";
  getExe = drv:
    getExe' drv (drv.meta.mainProgram or drv.pname or (builtins.parseDrvName drv.name).name);
in
{
  inherit genAttrs toLower hasPrefix licenses getLicenseFromSpdxId makeBinPath getExe getExe';
  meta = { inherit getLicenseFromSpdxId getExe getExe'; };
  attrsets = { inherit genAttrs; };
  strings = { inherit toLower hasPrefix makeBinPath; };
}
