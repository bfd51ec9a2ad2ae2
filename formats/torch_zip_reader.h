// The zip container of torch.save read: the entries of a stored (uncompressed) zip archive, the
// other direction of formats/torch_zip_writer.h, for the unpickler's files
// (formats/torch_state_dict.h, formats/torch_pickle.h). Every offset and size is bounds-checked.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace dstrain {

// Entry name -> its bytes, viewed inside `z` (which must outlive them). Zip64 sizes and offsets are
// read from the extra field where the 32-bit ones are saturated. Error naming `file` for a file
// that is not a zip, a compressed entry, or a structure that runs past the end (truncated).
std::map<std::string, std::string_view> read_stored_zip(const std::string& z, const std::string& file);

}  // namespace dstrain
