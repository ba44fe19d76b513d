// Every evaluation metric of reco::eval in one include.
//
//   #include "reco/eval/all.hpp"
//
// Each header below also stands alone; include only the ones you use to keep builds short.
#pragma once

#include "reco/eval/bleu.hpp"
#include "reco/eval/boxed_answer.hpp"
#include "reco/eval/distinct_n.hpp"
#include "reco/eval/kde.hpp"
#include "reco/eval/ngram.hpp"
#include "reco/eval/pass_at_k.hpp"
#include "reco/eval/path_uniqueness.hpp"
#include "reco/eval/token_variance.hpp"
