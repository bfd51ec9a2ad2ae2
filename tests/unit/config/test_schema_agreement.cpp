// config_schema/ds_config.schema.json and the parser's field tables (describe_fields) must agree on
// keys, aliases, types, defaults, enums and bounds, in both directions.
#include <algorithm>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"

namespace dstrain::config {
namespace {

Json load_schema() {
  std::ifstream in(DSTRAIN_SOURCE_DIR "/config_schema/ds_config.schema.json");
  EXPECT_TRUE(in.good()) << "cannot open the schema file";
  return Json::parse(in);
}

// The schema node of a section path ("" = root), or nullptr.
const Json* node_at(const Json& schema, const std::string& path) {
  const Json* node = &schema;
  if (path.empty()) return node;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->contains("properties") || !(*node)["properties"].contains(part)) return nullptr;
    node = &(*node)["properties"][part];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

std::set<std::string> type_set(const Json& prop) {
  std::set<std::string> out;
  if (!prop.contains("type")) return out;
  if (prop["type"].is_string())
    out.insert(prop["type"].get<std::string>());
  else
    for (const auto& t : prop["type"]) out.insert(t.get<std::string>());
  return out;
}

bool same_value(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

void check_field(const FieldSpec& f, const Json& prop, const std::string& spelling) {
  const std::string where = f.section.empty() ? spelling : f.section + "." + spelling;
  // type
  const std::set<std::string> types = type_set(prop);
  if (f.kind == FieldKind::any) {
    EXPECT_TRUE(types.empty()) << where;
  } else {
    EXPECT_TRUE(types.count(kind_name(f.kind))) << where << " type";
    EXPECT_EQ(types.count("null") == 1, f.nullable) << where << " nullability";
    EXPECT_EQ(types.size(), f.nullable ? 2u : 1u) << where;
  }
  // default
  ASSERT_TRUE(prop.contains("default")) << where;
  EXPECT_TRUE(same_value(prop["default"], f.default_value))
      << where << " default: schema " << prop["default"].dump() << " parser " << f.default_value.dump();
  // enums
  if (f.enum_values.empty()) {
    EXPECT_FALSE(prop.contains("enum")) << where;
    EXPECT_FALSE(prop.contains("x-enum-canonical")) << where;
  } else if (f.kind == FieldKind::integer) {
    std::vector<std::int64_t> expected;
    for (const auto& v : f.enum_values) expected.push_back(std::stoll(v));
    EXPECT_EQ(prop["enum"].get<std::vector<std::int64_t>>(), expected) << where;
  } else if (f.enum_case_insensitive) {
    EXPECT_EQ(prop["x-enum-canonical"].get<std::vector<std::string>>(), f.enum_values) << where;
    EXPECT_EQ(prop["x-case-insensitive"], true) << where;
    EXPECT_TRUE(prop.contains("pattern")) << where;
  } else {
    std::vector<std::string> values;
    for (const auto& v : prop["enum"])
      if (!v.is_null()) values.push_back(v.get<std::string>());
    EXPECT_EQ(values, f.enum_values) << where;
  }
  // bounds
  EXPECT_EQ(prop.contains("minimum"), f.minimum.has_value()) << where;
  if (f.minimum && prop.contains("minimum")) {
    EXPECT_DOUBLE_EQ(prop["minimum"].get<double>(), *f.minimum) << where;
  }
  EXPECT_EQ(prop.contains("maximum"), f.maximum.has_value()) << where;
  if (f.maximum && prop.contains("maximum")) {
    EXPECT_DOUBLE_EQ(prop["maximum"].get<double>(), *f.maximum) << where;
  }
  // deprecation
  EXPECT_EQ(prop.value("deprecated", false), !f.replaced_by.empty()) << where;
  EXPECT_TRUE(prop.contains("description")) << where;
}

TEST(SchemaAgreement, Draft202012) {
  const Json schema = load_schema();
  EXPECT_EQ(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(schema["type"], "object");
}

TEST(SchemaAgreement, EveryParserFieldIsInTheSchema) {
  const Json schema = load_schema();
  for (const auto& section : all_sections()) {
    const Json* node = node_at(schema, section.path);
    ASSERT_NE(node, nullptr) << "section missing from schema: " << section.path;
    ASSERT_TRUE(node->contains("properties")) << section.path;
    // Regime B: DeepSpeed forbids extra keys; regime A: unknown keys are warnings, so allowed.
    EXPECT_EQ((*node)["additionalProperties"], section.regime != Regime::validated) << section.path;
    for (const auto& f : section.fields) {
      ASSERT_TRUE((*node)["properties"].contains(f.key)) << "field missing from schema: " << f.path();
      check_field(f, (*node)["properties"][f.key], f.key);
      for (const auto& alias : f.aliases) {
        ASSERT_TRUE((*node)["properties"].contains(alias)) << "alias missing from schema: " << alias;
        const Json& a = (*node)["properties"][alias];
        EXPECT_EQ(a["x-alias-of"], f.key) << alias;
        check_field(f, a, alias);
      }
    }
  }
}

TEST(SchemaAgreement, EverySchemaKeyIsKnownToTheParser) {
  const Json schema = load_schema();
  std::set<std::string> section_paths;
  for (const auto& s : all_sections()) section_paths.insert(s.path);
  const auto sections = top_level_section_keys();
  for (const auto& section : all_sections()) {
    const Json& node = *node_at(schema, section.path);
    for (const auto& [key, prop] : node["properties"].items()) {
      const bool is_field = section.find(key) != nullptr;
      const bool is_section = section.path.empty() && std::find(sections.begin(), sections.end(), key) != sections.end();
      EXPECT_TRUE(is_field || is_section) << "schema key unknown to the parser: " << (section.path.empty() ? key : section.path + "." + key);
      // Any described sub-object must be a section the parser has a table for.
      if (prop.is_object() && prop.contains("properties")) {
        const std::string path = section.path.empty() ? key : section.path + "." + key;
        EXPECT_TRUE(section_paths.count(path)) << "schema section without a parser table: " << path;
      }
    }
  }
  for (const auto& key : sections) EXPECT_TRUE(schema["properties"].contains(key)) << "section key missing: " << key;
}

TEST(SchemaAgreement, DescribeFieldsCoversAllSections) {
  const auto fields = describe_fields();
  std::size_t total = 0;
  for (const auto& s : all_sections()) total += s.fields.size();
  EXPECT_EQ(fields.size(), total);
  const auto has = [&](const std::string& path) {
    return std::any_of(fields.begin(), fields.end(), [&](const FieldSpec& f) { return f.path() == path; });
  };
  EXPECT_TRUE(has("zero_optimization.prefetch_bucket_size"));
  EXPECT_TRUE(has("zero_optimization.offload_optimizer.pin_memory"));
  EXPECT_TRUE(has("aio.intra_op_parallelism"));
  EXPECT_TRUE(has("gradient_clipping"));
}

}  // namespace
}  // namespace dstrain::config
