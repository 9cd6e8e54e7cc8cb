// `atelier batch merge OUT_DIR... [--batch FILE] [--out DIR]`: the shards of
// one batch file (`atelier batch FILE --shard I/N`, one output folder each,
// on a Slurm array or a Kubernetes indexed Job) become one results.jsonl in
// line order, as a single run would have written it. Nothing is written
// unless every line is there exactly once: each shard's results.jsonl lists
// every line of its shard (batch writes it whole on every exit), so all N
// shards present means all lines present; with --batch the line numbers are
// checked against the file's request lines too.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands/commands.h"
#include "commands/output.h"

namespace atelier::app {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct MergeOptions {
  std::vector<std::string> dirs;
  std::string batch_file;  // "" = check by shards only
  std::string out_dir = "batch-out";
};

struct Shard {
  int index = 0, count = 1;
};

// "3/4" as batch writes it (its --shard was checked when it ran).
bool parse_shard(const std::string& s, Shard& out) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return false;
  try {
    size_t a = 0, b = 0;
    out.index = std::stoi(s.substr(0, slash), &a);
    out.count = std::stoi(s.substr(slash + 1), &b);
    return a == slash && b == s.size() - slash - 1 && out.count >= 1 && out.index >= 0 && out.index < out.count;
  } catch (const std::exception&) {
    return false;
  }
}

// "3, 7, 11" (at most 20, then "and K more").
std::string number_list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 20; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > 20) s += " and " + std::to_string(v.size() - 20) + " more";
  return s;
}

int run_merge(const MergeOptions& o) {
  struct Row {
    std::string text;  // the result line as the shard wrote it, less "shard"
    std::string from;  // DIR/results.jsonl:K
    bool complete = false;
    std::string error;
  };
  std::map<int, Row> rows;
  std::vector<std::string> problems;  // missing, duplicated or inconsistent lines: nothing is written
  std::map<int, std::string> shard_dirs;  // shard index -> the folder that holds it
  int shard_count = 0;                    // N of the shards seen (0 = none yet)
  std::set<fs::path> seen_dirs;
  std::error_code ec;
  const fs::path out_abs = fs::weakly_canonical(fs::absolute(o.out_dir, ec), ec);
  for (const std::string& dir : o.dirs) {
    const fs::path canon = fs::weakly_canonical(fs::absolute(dir, ec), ec);
    if (!seen_dirs.insert(canon).second)
      return fail(Status::error(StatusCode::InvalidArgument, dir + " is given twice: pass each shard's output folder once"));
    if (canon == out_abs)
      return fail(Status::error(StatusCode::InvalidArgument,
                                "--out " + o.out_dir + " is also a shard's folder (" + dir +
                                    "): merging there would replace that shard's results.jsonl; name another --out folder"));
    const fs::path file = fs::path(dir) / "results.jsonl";
    if (!fs::is_directory(dir, ec))
      return fail(Status::error(StatusCode::NotFound, dir + ": no such folder (pass the --out folders the shards wrote)"));
    std::ifstream in(file);
    if (!in)
      return fail(Status::error(StatusCode::NotFound, file.string() +
                                                          " does not exist: that shard has not finished (run it, or rerun the same "
                                                          "`atelier batch ... --shard I/N` command to finish it), then merge again"));
    int dir_shard = -1;
    std::string text;
    for (int k = 1; std::getline(in, text); ++k) {
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = file.string() + ":" + std::to_string(k);
      json r = json::parse(text, nullptr, false);
      if (r.is_discarded() || !r.is_object() || !r.contains("line") || !r["line"].is_number_integer() || r["line"].get<int64_t>() < 1 ||
          !r.contains("state") || !r["state"].is_string())
        return fail(Status::error(StatusCode::InvalidArgument,
                                  where + ": not a result line of `atelier batch` (a JSON object with \"line\" and \"state\"); "
                                          "pass the shards' output folders unchanged"));
      const int line = static_cast<int>(std::min<int64_t>(r["line"].get<int64_t>(), INT32_MAX));
      Shard s;  // a batch run without --shard is the one shard 0/1
      if (r.contains("shard") && !(r["shard"].is_string() && parse_shard(r["shard"].get<std::string>(), s)))
        return fail(Status::error(StatusCode::InvalidArgument, where + ": \"shard\" is not I/N"));
      r.erase("shard");
      if (shard_count == 0) shard_count = s.count;
      if (s.count != shard_count) {
        problems.push_back(where + ": line " + std::to_string(line) + " comes from a batch split in " + std::to_string(s.count) +
                           " shards, the others in " + std::to_string(shard_count) + ": merge the shards of one run");
        continue;
      }
      if (dir_shard < 0) {
        dir_shard = s.index;
        if (auto other = shard_dirs.find(s.index); other != shard_dirs.end())
          problems.push_back("shard " + std::to_string(s.index) + "/" + std::to_string(s.count) + " is in both " + other->second + " and " +
                             dir + ": pass one folder per shard");
        else
          shard_dirs[s.index] = dir;
      } else if (s.index != dir_shard) {
        problems.push_back(where + ": line " + std::to_string(line) + " is of shard " + std::to_string(s.index) + ", the rest of " + dir +
                           " of shard " + std::to_string(dir_shard));
      }
      if (line % s.count != s.index)
        problems.push_back(where + ": line " + std::to_string(line) + " does not belong to shard " + std::to_string(s.index) + "/" +
                           std::to_string(s.count));
      if (auto it = rows.find(line); it != rows.end()) {
        problems.push_back("line " + std::to_string(line) + " is there twice: " + it->second.from + " and " + where);
        continue;
      }
      Row row;
      row.from = where;
      row.complete = r["state"] == "completed";
      if (!row.complete)
        row.error = r.contains("error") && r["error"].is_string() ? r["error"].get<std::string>() : r["state"].get<std::string>();
      row.text = r.dump(-1, ' ', false, json::error_handler_t::replace);
      rows.emplace(line, std::move(row));
    }
    if (in.bad()) return fail(Status::error(StatusCode::Io, file.string() + ": cannot read it"));
  }
  // Every shard of the split, each once (a shard's file lists all its lines).
  for (int i = 0; i < shard_count; ++i)
    if (!shard_dirs.count(i))
      problems.push_back("shard " + std::to_string(i) + "/" + std::to_string(shard_count) + " is missing (its lines are those whose number is " +
                         std::to_string(i) + " modulo " + std::to_string(shard_count) + "): pass its output folder too");
  if (!o.batch_file.empty()) {
    std::ifstream in(o.batch_file);
    if (!in) return fail(Status::error(StatusCode::NotFound, o.batch_file + ": cannot open the batch file"));
    std::set<int> requests;
    std::string text;
    for (int number = 1; std::getline(in, text); ++number)
      if (text.find_first_not_of(" \t\r") != std::string::npos) requests.insert(number);
    std::vector<int> missing, extra;
    for (int n : requests)
      if (!rows.count(n)) missing.push_back(n);
    for (const auto& [n, row] : rows)
      if (!requests.count(n)) extra.push_back(n);
    if (!missing.empty())
      problems.push_back(std::to_string(missing.size()) + " line(s) of " + o.batch_file + " have no result: " + number_list(missing) +
                         " (run their shard, or rerun it to finish, then merge again)");
    if (!extra.empty())
      problems.push_back("line(s) " + number_list(extra) + " are not request lines of " + o.batch_file +
                         ": these results come from another batch file");
  }
  if (rows.empty() && problems.empty()) problems.push_back("the folders hold no result lines");
  if (!problems.empty()) {
    for (const auto& p : problems) std::fprintf(stderr, "atelier: error: %s\n", p.c_str());
    std::fprintf(stderr, "atelier: nothing was merged (%zu problem(s) above)\n", problems.size());
    return 1;
  }
  std::string body;
  std::vector<std::string> failed;
  for (const auto& [n, row] : rows) {
    body += row.text + "\n";
    if (!row.complete) failed.push_back("line " + std::to_string(n) + ": " + row.error);
  }
  fs::create_directories(o.out_dir, ec);
  if (ec) return fail(Status::error(StatusCode::Io, o.out_dir + ": cannot create the output folder: " + ec.message()));
  const fs::path results = fs::path(o.out_dir) / "results.jsonl";
  if (Status st = write_file_atomically(results, body); !st.ok()) return fail(st);
  std::fprintf(stderr, "merged %zu line(s) from %zu folder(s) into %s\n", rows.size(), o.dirs.size(), results.string().c_str());
  if (failed.empty()) return 0;
  std::fprintf(stderr, "atelier: %zu of %zu lines did not complete:\n", failed.size(), rows.size());
  for (const auto& f : failed) std::fprintf(stderr, "  %s\n", f.c_str());
  std::fprintf(stderr, "rerun their shards' `atelier batch` commands (a failed line is queued afresh), then merge again\n");
  return 1;
}

}  // namespace

void add_batch_merge_command(CLI::App& batch, int& exit_code) {
  auto o = std::make_shared<MergeOptions>();
  CLI::App* merge = batch.add_subcommand(
      "merge", "Merge the results.jsonl of a batch's shards (--shard I/N) into one, in line order, each line exactly once");
  merge->add_option("dirs", o->dirs, "The shards' --out folders")->required();
  merge->add_option("--batch", o->batch_file, "The batch file the shards ran: every request line of it must have a result");
  merge->add_option("--out", o->out_dir, "Folder for the merged results.jsonl")->capture_default_str();
  merge->callback([o, &exit_code] { exit_code = run_merge(*o); });
}

}  // namespace atelier::app
