# `cmake --install BUILD --prefix P`: the programs, the launch scripts, the tools and the shipped
# default's data, laid out so that each finds the others from where it lies:
#   P/bin/lfm2-rank, P/bin/h5pack
#   P/bin/lfm2-local  -> ../share/lfm2-rank/launch/local.sh   (mpirun on this machine, docs/pipeline.md)
#   P/bin/lfm2-text   -> ../share/lfm2-rank/tools/lfm2_text.py (the text front end, docs/text.md)
#   P/share/lfm2-rank/launch/        local.sh, slurm.sbatch, disk-read.sh
#   P/share/lfm2-rank/tools/         the user-facing tools/ scripts, lfm2text/, requirements*.txt
#   P/share/lfm2-rank/data/default/  recipe.json, inputs.h5, answers.h5 (its model is generated on
#                                    first use into ${XDG_CACHE_HOME:-~/.cache}/lfm2-rank, never here)
#   P/share/doc/lfm2_rank/           README.md and docs/*.md
include(GNUInstallDirs)
set(LFM2_SHARE_DIR ${CMAKE_INSTALL_DATADIR}/lfm2-rank)

install(TARGETS lfm2-rank h5pack RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS launch/local.sh launch/slurm.sbatch launch/disk-read.sh DESTINATION ${LFM2_SHARE_DIR}/launch)
install(PROGRAMS tools/lfm2_text.py tools/hf_answers.py tools/plan_layout.py tools/trace_gantt.py
        DESTINATION ${LFM2_SHARE_DIR}/tools)
install(FILES tools/tool_cli.py tools/requirements.txt tools/requirements-text.txt tools/README.md
        DESTINATION ${LFM2_SHARE_DIR}/tools)
install(DIRECTORY tools/lfm2text DESTINATION ${LFM2_SHARE_DIR}/tools FILES_MATCHING PATTERN "*.py")
install(FILES data/default/recipe.json data/default/inputs.h5 data/default/answers.h5
        DESTINATION ${LFM2_SHARE_DIR}/data/default)
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md" PATTERN "*.png")

# The commands on PATH, as relative links (the prefix can move).
foreach(pair "lfm2-local|../${LFM2_SHARE_DIR}/launch/local.sh" "lfm2-text|../${LFM2_SHARE_DIR}/tools/lfm2_text.py")
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 target)
  install(CODE "
    set(link \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/${name}\")
    file(REMOVE \"\${link}\")
    file(CREATE_LINK \"${target}\" \"\${link}\" SYMBOLIC)
    message(STATUS \"Installing: \${link} -> ${target}\")")
endforeach()
