// The model families dstrain knows, and a model from a --model spec.
//
// The built-in families (models/model_registry.cpp: GPT-2, the Llama family) come first; an
// application that embeds dstrain adds its own with register_model_family before it reads a spec.
// A spec is "<family>:<rest>" (gpt2:d12, llama:L4-C256-H4), or the path of a Hugging Face
// config.json (or of its folder), read by the family that claims it (ModelFamily::reads_hf_config).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "models/model.h"
#include "models/model_family.h"

namespace dstrain {

// Adds a family (thread-safe). Error when its name is empty, holds a ':' or is taken.
void register_model_family(std::shared_ptr<const ModelFamily> family);

// Every family, the built-in ones first, then the registered ones in registration order.
std::vector<std::shared_ptr<const ModelFamily>> model_families();

// The family of this name. Error listing the families otherwise.
const ModelFamily& model_family(std::string_view name);

// The architecture a spec names. Error naming the spec and every family's accepted forms when no
// family reads it; for a config.json no family claims, naming its model_type and architectures.
std::shared_ptr<const Architecture> model_architecture(std::string_view spec);

// make_model(model_architecture(spec)).
Model make_model(std::string_view spec);

}  // namespace dstrain
