// open_sample_set(): which kind of SampleSet a training or test set is, by one rule, and the
// formats it takes.
#include <mpiddp/error.hpp>
#include <mpiddp/tokens.hpp>
#include <mpiddp/trainer.hpp>

#include <algorithm>

#include "common/text.hpp"

namespace mpiddp {

std::vector<std::string> data_format_names() { return {"auto", "hdf5", "llmc", "raw-uint16"}; }

void check_data_format(const std::string& format, const std::string& what) {
  const auto names = data_format_names();
  MPIDDP_CHECK(std::find(names.begin(), names.end(), format) != names.end(), detail::unknown_name(what, format, names));
}

std::unique_ptr<SampleSet> open_sample_set(const std::string& source, const TrainerOptions& o) {
  const bool hdf5 =
      o.data_format == "hdf5" ||
      (o.data_format == "auto" && (detail::ends_with(source, ".h5") || detail::ends_with(source, ".hdf5")));
  if (hdf5) return std::make_unique<H5Dataset>(source);
  MPIDDP_CHECK(o.block_size > 0, "token data '" + source +
                                     "' needs a block size (TrainerOptions::block_size, "
                                     "--block-size): the tokens of each sample's input");
  const auto format = o.data_format == "raw-uint16" ? TokenFormat::kRawUint16 : TokenFormat::kLlmc;
  auto stream = std::make_shared<const TokenStream>(detail::split_list(source), format);
  return std::make_unique<TokenWindows>(std::move(stream), o.block_size, source);
}

}  // namespace mpiddp
