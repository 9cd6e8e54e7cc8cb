// The fixtures' SHA256SUMS (sha256sum's output, "./" paths) as path ->
// digest: the independent source the store tests check digests against.
#pragma once

#include <fstream>
#include <map>
#include <string>

namespace atelier::test {

inline std::map<std::string, std::string> fixture_sums(const std::string& fixtures_dir) {
  std::map<std::string, std::string> sums;
  std::ifstream in(fixtures_dir + "/SHA256SUMS");
  for (std::string sha, path; in >> sha >> path;) sums[path.rfind("./", 0) == 0 ? path.substr(2) : path] = sha;
  return sums;
}

}  // namespace atelier::test
